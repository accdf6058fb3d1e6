package prom_test

import dto "github.com/prometheus/client_model/go"

// labels returns the label pairs as a map.
func labels(pairs []*dto.LabelPair) map[string]string {
	m := make(map[string]string, len(pairs))
	for _, p := range pairs {
		m[p.GetName()] = p.GetValue()
	}
	return m
}
