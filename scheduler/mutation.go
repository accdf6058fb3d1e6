package scheduler

// mutation names a deliberate bug. Only the package's own tests switch one
// on, to prove that the state machine test catches it; the zero value, the
// only one outside those tests, is no bug.
type mutation uint8

const (
	mutNone          mutation = iota
	mutIgnoreKeep             // free blocks at Finish even when the connector keeps them
	mutOverReserve            // reserve blocks for the whole prompt at admission
	mutLookupAlways           // ask the connector even with prefix caching off
	mutKeepCache              // Invalidate keeps the local prefix cache
	mutNoRotate               // Invalidate does not rotate the connector
	mutTrustFailed            // a failed load counts as wholly loaded
	mutRequeueEarly           // a preempted request waits again before its release
	mutDoubleRelease          // releasing a request drops its first block twice
	mutLastToken              // a local hit may cover the last token
	mutPendingBlocks          // a lookup-pending request holds up those behind it
	mutCount
)

func (m mutation) String() string {
	return [...]string{"none", "ignore-keep", "over-reserve", "lookup-always", "keep-cache", "no-rotate",
		"trust-failed", "requeue-early", "double-release", "last-token", "pending-blocks"}[m]
}
