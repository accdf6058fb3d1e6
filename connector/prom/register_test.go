package prom_test

import (
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvconnect/kvconnect/connector/prom"
	"github.com/kvconnect/kvconnect/store/memstore"
)

// TestRegisterDuplicate: a collector registered twice is refused with an
// error naming its metric and labels and what tells two apart, and
// Register leaves nothing of a refused call registered.
func TestRegisterDuplicate(t *testing.T) {
	s, err := memstore.New(memstore.Config{Capacity: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	reg := prometheus.NewPedanticRegistry()
	opts := prom.Options{Labels: prometheus.Labels{"engine": "a"}}
	if err := prom.Register(reg, prom.InstrumentStore(s, opts)); err != nil {
		t.Fatalf("Register of the first instrumented store: %v", err)
	}
	tokens := prom.NewPromptTokens(prom.Options{})
	err = prom.Register(reg, tokens, prom.InstrumentStore(s, opts))
	for _, want := range []string{"collector 2 of 2", "kvconnect_store_operation_duration_seconds", `engine="a"`, "Options.Labels"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Register of a second store with the same labels = %v, want an error naming %q", err, want)
		}
	}

	// The PromptTokens of the refused call were unregistered: they
	// register again.
	if err := prom.Register(reg, tokens); err != nil {
		t.Errorf("Register(tokens) after the refused call = %v: the refused call left it registered", err)
	}
	opts.Labels["engine"] = "b"
	if err := prom.Register(reg, prom.InstrumentStore(s, opts)); err != nil {
		t.Errorf("Register of a store with another engine label: %v", err)
	}
}

// TestInstrumentStoreNil: InstrumentStore(nil) panics at once with a
// message naming the argument, not at the wrapper's first call.
func TestInstrumentStoreNil(t *testing.T) {
	defer func() {
		r := recover()
		if msg, _ := r.(string); !strings.Contains(msg, "InstrumentStore(nil") || !strings.Contains(msg, "store s is nil") {
			t.Errorf("InstrumentStore(nil) panicked with %v, want a message naming the nil store", r)
		}
	}()
	prom.InstrumentStore(nil, prom.Options{})
}
