package prom

import (
	"errors"
	"fmt"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
)

// Register registers every collector on reg, all or none: when one is
// refused, those registered before it are unregistered and the error
// names the refused collector's metric and constant labels, and says how
// to tell two such collectors apart. client_golang's own message for a
// collector registered twice ("duplicate metrics collector registration
// attempted") names neither.
func Register(reg prometheus.Registerer, cs ...prometheus.Collector) error {
	for i, c := range cs {
		err := reg.Register(c)
		if err == nil {
			continue
		}
		for _, done := range cs[:i] {
			reg.Unregister(done)
		}
		what := describe(c)
		if are := (prometheus.AlreadyRegisteredError{}); errors.As(err, &are) {
			return fmt.Errorf("prom: register collector %d of %d (%s): a collector of the same metrics with the same labels is already registered: give one of them a label of Options.Labels that tells them apart (a Worker: another rank): %w", i+1, len(cs), what, err)
		}
		return fmt.Errorf("prom: register collector %d of %d (%s): %w", i+1, len(cs), what, err)
	}
	return nil
}

// describe names the first metric of c, with its constant labels, from
// its Desc (whose String is client_golang's: fqName, help, constLabels,
// variableLabels), and how many more c has.
func describe(c prometheus.Collector) string {
	ch := make(chan *prometheus.Desc)
	go func() {
		c.Describe(ch)
		close(ch)
	}()
	var first string
	n := 0
	for d := range ch {
		if n == 0 {
			first = d.String()
		}
		n++
	}
	if n == 0 {
		return "no metrics"
	}
	name, labels := field(first, "fqName: "), field(first, "constLabels: ")
	out := strings.Trim(name, `"`)
	if labels != "" && labels != "{}" {
		out += labels
	}
	if n > 1 {
		out += fmt.Sprintf(" and %d more metrics", n-1)
	}
	return out
}

// field returns the value after key in a Desc's String: up to the next
// ", " outside braces and quotes.
func field(s, key string) string {
	i := strings.Index(s, key)
	if i < 0 {
		return ""
	}
	s = s[i+len(key):]
	depth, quoted := 0, false
	for j := 0; j < len(s); j++ {
		switch c := s[j]; {
		case c == '\\' && quoted:
			j++
		case c == '"':
			quoted = !quoted
		case quoted:
		case c == '{':
			depth++
		case c == '}':
			if depth == 0 {
				return s[:j]
			}
			depth--
		case c == ',' && depth == 0:
			return s[:j]
		}
	}
	return s
}
