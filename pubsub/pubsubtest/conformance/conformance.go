package conformance

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"testing/synctest"

	"github.com/logbus/logbus/engine"
	"github.com/logbus/logbus/pubsub"
)

// Engine describes a broker implementation to [RunConformance]: how to build
// one, and what the suite cannot check of it. Which optional promises it
// keeps is not written here: the suite reads them from the engine
// ([pubsub.Broker.Capabilities], which is the engine's Capabilities).
type Engine struct {
	// Name names the engine in skip messages and in the summary.
	Name string
	// NewBroker returns a running broker on a fresh, empty engine, built
	// with opts, and registers its Close at tb's cleanup (as
	// [pubsubtest.NewBroker] does). An engine may refuse options it cannot
	// honour: NewTopic then fails with an error wrapping [pubsub.ErrInvalid].
	// The suite only passes such options in subtests that need the
	// matching capability. NewBroker is called from the goroutine running
	// the subtest, inside its testing/synctest bubble when the engine has
	// [engine.VirtualTime], and once more, outside any bubble, to read the
	// engine's capabilities; a suite test may close the broker itself, so
	// the cleanup must accept a broker that is already closed.
	NewBroker func(tb testing.TB, opts ...pubsub.BrokerOption) *pubsub.Broker
	// Untestable declares capabilities the engine keeps but the suite
	// cannot check on it, each with the reason (a server that keeps its
	// own clock cannot be checked against an injected one, say). A case
	// that needs one is skipped, and the summary says why. Each key is one
	// capability the engine has: anything else fails the suite, so that
	// no skip is silent or mistaken.
	Untestable map[engine.Capabilities]string
}

// RunConformance checks that e keeps every guarantee of the logbus
// documentation (the module's doc.go and the pubsub API) through the public
// API only: per-key ordering, consumer groups, at-least-once delivery,
// retries and dead letters, retention and backpressure, start positions,
// seek and replay, pause, Drain, Close, streams, batch consumers, the error
// contract, typed keys and asynchronous publishing. An engine author calls
// it from a test:
//
//	func TestConformance(t *testing.T) {
//		conformance.RunConformance(t, conformance.Engine{
//			Name:      "remote",
//			NewBroker: newRemoteBroker,
//		})
//	}
//
// Each guarantee is a subtest named by a sentence, grouped by topic
// ("Ordering", "Retries and dead letters", ...), so go test -run can pick
// one. Every subtest builds its own broker with e.NewBroker. What the
// engine promises beyond what every engine keeps it declares itself
// ([engine.Capabilities], read from a broker built for the purpose): the
// cases that need a promise it lacks, or one it declares Untestable, are
// skipped, naming it. When it has [engine.VirtualTime], each subtest runs
// in its own testing/synctest bubble, except the few that hunt a race a
// bubble's scheduling would hide, which say so and run in real time.
// Without it every subtest runs in real time: it waits on barriers (Drain,
// Recorder.WaitFor, channels), a timeout only bounds a failure (10s), and
// the short waits it does take are the engine's own (a BlockTimeout, a
// retry backoff, a context of tens of milliseconds that must end).
//
// RunConformance logs a summary of every skip and why (shown with go test
// -v). It must be called from the test's goroutine; it does not call
// t.Parallel.
func RunConformance(t *testing.T, e Engine) {
	t.Helper()
	have, untestable := Capabilities(t, e)
	var ran int
	var lacking, notTested []string
	for _, g := range conformanceGroups() {
		t.Run(g.name, func(t *testing.T) {
			for _, tc := range g.cases {
				t.Run(tc.name, func(t *testing.T) {
					ran++
					missing, cannot := tc.needs&^have, tc.needs&untestable
					switch {
					case missing != 0:
						lacking = append(lacking, fmt.Sprintf("%s: lacks %v", t.Name(), missing))
						t.Skipf("engine %q lacks capability %v", e.Name, missing)
					case cannot != 0:
						notTested = append(notTested, fmt.Sprintf("%s: %v untestable", t.Name(), cannot))
						t.Skipf("engine %q keeps %v, which the suite cannot check on it: %s", e.Name, cannot, reasons(e, cannot))
					}
					if have.Has(engine.VirtualTime) && !tc.realTime {
						synctest.Test(t, func(t *testing.T) { tc.run(newConf(t, e, true)) })
						return
					}
					tc.run(newConf(t, e, false))
				})
			}
		})
	}
	summary := fmt.Sprintf("conformance: engine %q has %v: %d conformance subtests", e.Name, have, ran)
	if len(lacking) == 0 && len(notTested) == 0 {
		t.Log(summary + ", none skipped")
		return
	}
	if len(lacking) > 0 {
		summary += fmt.Sprintf(";\n%d skipped for lack of a capability:\n\t%s", len(lacking), strings.Join(lacking, "\n\t"))
	}
	if len(notTested) > 0 {
		summary += fmt.Sprintf(";\n%d skipped for a capability the engine declares untestable (%s):\n\t%s",
			len(notTested), reasons(e, untestable), strings.Join(notTested, "\n\t"))
	}
	t.Log(summary)
}

// Capabilities returns what e promises beyond what every engine keeps, read
// from a broker it builds and closes ([pubsub.Broker.Capabilities]), and the
// part of it e declares Untestable. It fails tb when e is not well formed:
// no NewBroker, or an Untestable key that is not one capability e has, or
// has no reason. [RunConformance] and the property suite call it first.
func Capabilities(tb testing.TB, e Engine) (have, untestable engine.Capabilities) {
	tb.Helper()
	if e.NewBroker == nil {
		tb.Fatalf("conformance: engine %q: NewBroker is nil", e.Name)
	}
	b := e.NewBroker(tb)
	if b == nil {
		tb.Fatalf("conformance: engine %q: NewBroker returned nil", e.Name)
	}
	have = b.Capabilities()
	ctx, cancel := context.WithTimeout(context.Background(), failureBound)
	defer cancel()
	if err := b.Close(ctx); err != nil {
		tb.Fatalf("conformance: engine %q: Close of a broker that did nothing: %v", e.Name, err)
	}
	for c, why := range e.Untestable {
		switch {
		case c == 0 || c&(c-1) != 0 || !engine.AllCapabilities.Has(c):
			tb.Fatalf("conformance: engine %q: Untestable key %v is not one capability", e.Name, c)
		case !have.Has(c):
			tb.Fatalf("conformance: engine %q declares %v untestable, but does not have it (it has %v)", e.Name, c, have)
		case strings.TrimSpace(why) == "":
			tb.Fatalf("conformance: engine %q declares %v untestable without a reason", e.Name, c)
		}
		untestable |= c
	}
	return have, untestable
}

// reasons says why e cannot be checked for each capability of cs.
func reasons(e Engine, cs engine.Capabilities) string {
	var out []string
	for c, why := range e.Untestable {
		if cs.Has(c) {
			out = append(out, fmt.Sprintf("%v: %s", c, why))
		}
	}
	slices.Sort(out)
	return strings.Join(out, "; ")
}

// confGroup is one heading of the suite.
type confGroup struct {
	name  string
	cases []confCase
}

// confCase is one guarantee, checked by run.
type confCase struct {
	name  string              // the guarantee, as a sentence
	needs engine.Capabilities // what the engine must declare for it to run
	// realTime runs the case outside a bubble even under Synctest: it
	// hunts a race that a bubble's scheduling hides.
	realTime bool
	run      func(c *conf)
}

// conformanceGroups lists the suite, in the order it runs.
func conformanceGroups() []confGroup {
	return []confGroup{
		{"Ordering", orderingCases()},
		{"Groups", groupCases()},
		{"Delivery", deliveryCases()},
		{"Retries and dead letters", retryCases()},
		{"Retention and backpressure", retentionCases()},
		{"Start positions", startCases()},
		{"Seek and Replay", seekCases()},
		{"Pause and Resume", pauseCases()},
		{"Drain and ErrStalled", drainCases()},
		{"Close and ShutdownError", closeCases()},
		{"Streams", streamCases()},
		{"Batch consumers", batchCases()},
		{"Errors", errorCases()},
		{"Typed keys", keyCases()},
		{"Observability", observeCases()},
		{"Deleting, discarding and Ping", deleteCases()},
		{"Asynchronous publishing", asyncCases()},
		{"Key concurrency", keyConcurrencyCases()},
	}
}
