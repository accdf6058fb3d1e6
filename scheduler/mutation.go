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
	mutKeepWindow             // sliding-window blocks out of the window stay in the table
	mutWindowShort            // the window is one token short: the block of its first token is freed while in it
	mutStateOffByOne          // a state at a block boundary is kept in the entry of the next boundary
	mutNoAlign                // prefill chunks end anywhere: a state left inside a block stays in the table as the state at its end
	mutFreeBusy               // a sliding-window block out of the table is freed while a transfer names it
	mutIdleNoNews             // a load or release the connector reports does not end Idle
	mutCount
)

func (m mutation) String() string {
	return [...]string{"none", "ignore-keep", "over-reserve", "lookup-always", "keep-cache", "no-rotate",
		"trust-failed", "requeue-early", "double-release", "last-token", "pending-blocks",
		"keep-window", "window-short", "state-off-by-one", "no-align", "free-busy", "idle-no-news"}[m]
}
