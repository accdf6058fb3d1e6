package prom

import (
	"fmt"
	"maps"

	"github.com/prometheus/client_golang/prometheus"
)

const namespace = "kvconnect"

// Options are what every collector of the package is built with.
type Options struct {
	// Labels are constant labels added to every metric of the collector:
	// the engine's or the connector's name, the model, the instance.
	// They are fixed at construction; never put a request, a key, a
	// token or a tenant in one. A name the package uses itself (role,
	// rank, operation, status, result, direction, source, reason or
	// "le") is a programming error: the constructor panics.
	Labels prometheus.Labels
}

// labels returns o.Labels with the collector's own constant labels added,
// in a new map. It panics if o.Labels names one of own, or one of the
// variable labels of the collector (reserved).
func (o Options) labels(own prometheus.Labels) prometheus.Labels {
	for name := range o.Labels {
		if _, ok := own[name]; ok || reserved(name) {
			panic(fmt.Sprintf("prom: Options.Labels[%q]: the collector sets the label %q itself; choose another name", name, name))
		}
	}
	l := make(prometheus.Labels, len(o.Labels)+len(own))
	maps.Copy(l, o.Labels)
	maps.Copy(l, own)
	return l
}

// reserved reports whether the package's metrics use the label name,
// constant or variable.
func reserved(name string) bool {
	switch name {
	case "role", "rank", "operation", "status", "result", "direction", "source", "reason", "medium", "le":
		return true
	}
	return false
}
