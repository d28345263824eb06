package conformance_test

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"

	"go.uber.org/goleak"

	"github.com/logbus/logbus/engine"
	"github.com/logbus/logbus/internal/asyncfake"
	"github.com/logbus/logbus/pubsub"
	"github.com/logbus/logbus/pubsub/pubsubtest"
	"github.com/logbus/logbus/pubsub/pubsubtest/conformance"
)

// Every broker a case builds must be closed by the end of it: a leftover
// worker goroutine fails the package.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// The in-memory engine keeps every promise of the conformance suite.
func TestConformance(t *testing.T) {
	conformance.RunConformance(t, conformance.Engine{Name: "memory", NewBroker: pubsubtest.NewBroker})
}

// An engine that declares no capability runs the rest of the suite in real
// time, as it runs for an engine that cannot live in a testing/synctest
// bubble: the in-memory engine passes it that way too.
func TestConformanceInRealTime(t *testing.T) {
	conformance.RunConformance(t, conformance.Engine{
		Name:      "memory, no capabilities declared",
		NewBroker: lesserBroker(0),
	})
}

// A case that needs a capability the engine declares untestable is
// skipped, not run, though the engine keeps it; the others run.
func TestUntestableCapabilitiesAreSkipped(t *testing.T) {
	var mu sync.Mutex
	var built []string // the subtests that built a broker: those that ran
	conformance.RunConformance(t, conformance.Engine{
		Name: "memory, Redrive and MaxBytes untestable",
		NewBroker: func(tb testing.TB, opts ...pubsub.BrokerOption) *pubsub.Broker {
			mu.Lock()
			built = append(built, tb.Name())
			mu.Unlock()
			return pubsubtest.NewBroker(tb, opts...)
		},
		Untestable: map[engine.Capabilities]string{
			engine.Redrive:  "a reason",
			engine.MaxBytes: "another",
		},
	})
	ran := func(name string) bool {
		return slices.ContainsFunc(built, func(n string) bool { return strings.Contains(n, name) })
	}
	for _, name := range []string{"Redrive_delivers_a_dead_letter_again", "MaxBytes_bounds_the_key_and_value_bytes"} {
		if ran(name) {
			t.Errorf("%s ran; want it skipped: its capability is declared untestable", name)
		}
	}
	if !ran("DropOldest_evicts_the_oldest_record") {
		t.Error("DropOldest's case did not run; want only the untestable capabilities' cases skipped")
	}
}

// The declaration of what cannot be tested is checked: an unknown or
// combined capability, one the engine lacks, or one without a reason
// fails the suite before any case runs.
func TestUntestableMustBeOneCapabilityTheEngineHasWithAReason(t *testing.T) {
	for name, untestable := range map[string]map[engine.Capabilities]string{
		"two at once":     {engine.MaxAge | engine.MaxBytes: "why"},
		"unknown":         {engine.AllCapabilities + 1: "why"},
		"one it lacks":    {engine.CustomIDs: "why"},
		"without reasons": {engine.MaxAge: " "},
	} {
		tb := &fatalTB{TB: t}
		func() {
			defer func() {
				if v := recover(); v != nil && v != errFatal {
					panic(v)
				}
			}()
			conformance.Capabilities(tb, conformance.Engine{Name: name, NewBroker: lesserBroker(engine.MaxAge | engine.MaxBytes), Untestable: untestable})
		}()
		if tb.fatal == "" {
			t.Errorf("%s: Capabilities accepted %v", name, untestable)
		}
	}
}

// fatalTB records the message of Fatalf, and panics with errFatal to stop
// the caller as Fatalf would.
type fatalTB struct {
	testing.TB
	fatal string
}

var errFatal = errors.New("fatal")

func (tb *fatalTB) Helper() {}
func (tb *fatalTB) Fatalf(format string, args ...any) {
	tb.fatal = fmt.Sprintf(format, args...)
	panic(errFatal)
}

// lesserBroker builds brokers on the in-memory engine declaring only caps:
// an engine that lacks the others, which the suite must not check.
func lesserBroker(caps engine.Capabilities) func(testing.TB, ...pubsub.BrokerOption) *pubsub.Broker {
	return func(tb testing.TB, opts ...pubsub.BrokerOption) *pubsub.Broker {
		return pubsubtest.NewBroker(tb, append(opts, pubsub.WithEngine(lesser{caps}))...)
	}
}

// lesser is the in-memory engine claiming only caps. It hides the
// optional interfaces of the engine (it embeds engine.Engine): a Group it
// hands out keeps its own, which the typed layer uses only where caps
// says so.
type lesser struct{ caps engine.Capabilities }

func (l lesser) Open(cfg engine.Config) (engine.Engine, error) {
	e, err := pubsub.InMemory().Open(cfg)
	return lesserEngine{e, l.caps}, err
}

type lesserEngine struct {
	engine.Engine
	caps engine.Capabilities
}

func (l lesserEngine) Capabilities() engine.Capabilities { return l.caps }

// The in-memory engine made to confirm records later, as a remote engine
// does (internal/asyncfake), keeps every promise too: it runs the typed
// layer's asynchronous path (records in flight, Flush, Drain and Close
// waiting for them) under the whole suite.
func TestConformanceConfirmingLater(t *testing.T) {
	conformance.RunConformance(t, conformance.Engine{
		Name: "memory, confirming later",
		NewBroker: func(tb testing.TB, opts ...pubsub.BrokerOption) *pubsub.Broker {
			return pubsubtest.NewBroker(tb, append(opts, pubsub.WithEngine(&asyncfake.Driver{}))...)
		},
	})
}
