package conformance

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"testing/synctest"

	"github.com/logbus/logbus/pubsub"
)

// Engine describes a broker implementation to RunConformance: how to build
// one, and which of the optional promises (Capabilities) it keeps.
type Engine struct {
	// Name names the engine in skip messages and in the summary.
	Name string
	// NewBroker returns a running broker on a fresh, empty engine, built
	// with opts, and registers its Close at tb's cleanup (as
	// [pubsubtest.NewBroker] does). An engine may refuse options it cannot honour:
	// NewTopic then fails with an error wrapping pubsub.ErrInvalid. The
	// suite only passes such options in subtests that need the matching
	// Capability. NewBroker is called from the goroutine running the
	// subtest, inside its testing/synctest bubble when the engine declares
	// Synctest; a suite test may close the broker itself, so the cleanup
	// must accept a broker that is already closed.
	NewBroker func(tb testing.TB, opts ...pubsub.BrokerOption) *pubsub.Broker
	// Capabilities lists the optional promises the engine keeps. Subtests
	// that need one it lacks are skipped. An unknown Capability fails the
	// suite, so a typo cannot skip tests silently.
	Capabilities []Capability
}

// Capability is a promise that only some engines keep. A conformance
// subtest that needs a capability the Engine does not declare is skipped
// with a message naming it, and RunConformance logs every such skip. The
// guarantees no capability names (ordering, groups, delivery, retries,
// Block backpressure, start positions, seek and replay, pause, Drain,
// Close, streams, errors) are checked on every engine.
type Capability string

const (
	// Synctest: the engine runs inside a testing/synctest bubble (all its
	// goroutines and timers belong to the bubble of the test that built
	// it). Each subtest then runs in its own bubble, so waits cost no real
	// time, synctest.Wait lets a subtest look at a settled state, and
	// time-dependent checks are exact: retry backoff, Block's timeout, the
	// time Close takes. (A subtest that hunts a race a bubble would hide
	// runs in real time all the same, so the engine must work outside a
	// bubble too.) Without it, the time-dependent checks are skipped and
	// the others run in real time, waiting on Drain, Recorder.WaitFor and
	// channels, with timeouts that only bound a failure.
	Synctest Capability = "synctest"
	// InjectedClock: the engine reads the pubsub.Clock given with
	// pubsub.WithClock for Message.Created, Retention.MaxAge and
	// DeadLetter.FailedAt, and for StartAt(AtTime) and Replay(AtTime).
	InjectedClock Capability = "injected-clock"
	// CustomIDs: the engine takes Message.ID from the pubsub.IDSource given
	// with pubsub.WithIDs, calling it once per record published.
	CustomIDs Capability = "custom-ids"
	// ExactBlock: a Publish to a full Block partition waits exactly
	// Retention.BlockTimeout for the slowest group to commit before it fails
	// with pubsub.ErrBackpressure. Checked in virtual time, so it also
	// needs Synctest.
	ExactBlock Capability = "exact-block"
	// ReclaimOnCommit: a full partition frees the records every group has
	// committed past (counted in TopicStats.Reclaimed), so a producer
	// blocked under Block gets room as soon as the slowest group commits.
	ReclaimOnCommit Capability = "reclaim-on-commit"
	// GiveBack: a Stream delivery that nobody has received, taken back by
	// Pause, Seek, Replay, Leave or a rebalance, counts no attempt: it
	// comes again with the same Message.Attempt, and nothing is counted
	// in GroupStats.Retried.
	GiveBack Capability = "give-back"
	// DropOldest: the engine honours Retention.OnFull = pubsub.DropOldest.
	DropOldest Capability = "drop-oldest"
	// MaxAge: the engine honours Retention.MaxAge, trimming records older
	// than it (TopicStats.Expired).
	MaxAge Capability = "max-age"
	// MaxBytes: the engine honours Retention.MaxBytes, bounding the bytes
	// (keys, values and headers) each partition retains.
	MaxBytes Capability = "max-bytes"
	// Snapshots: Broker.Snapshot describes the engine in full (not
	// Partial): deliveries in flight with their attempt, lag in time,
	// paused groups.
	Snapshots Capability = "snapshots"
	// Observed: the engine raises the events only it sees (retry, dead
	// letter, rebalance, backpressure, drop, expiry, skip) to the hooks of
	// pubsub.WithHooks. Publish and delivery hooks are checked on every
	// engine.
	Observed Capability = "observed"
	// Redrive: Group.Redrive sends dead letters back to their group.
	Redrive Capability = "redrive"
	// StuckDetection: the engine honours pubsub.WithStuckAfter, reporting
	// a delivery that runs too long to HookStuck and in the Snapshot.
	// Checked by waiting on the events; how long each report comes after
	// the delivery began is checked in virtual time, with Synctest.
	StuckDetection Capability = "stuck-detection"
	// Batches: the engine delivers to Topic.SubscribeBatch consumers (an
	// engine without it refuses them with pubsub.ErrInvalid), and a batch
	// holds the records already there when the consumer looks, up to
	// WithBatchSize.
	Batches Capability = "batches"
	// Delete: Broker.DeleteGroup and Broker.DeleteTopic delete groups and
	// topics (an engine without it refuses them with pubsub.ErrInvalid).
	// The cases that need it run in real time as well as in a bubble: none
	// needs virtual time.
	Delete Capability = "delete"
	// DiscardDeadLetters: Group.DiscardDeadLetters drops dead letters (an
	// engine without it refuses with pubsub.ErrInvalid).
	DiscardDeadLetters Capability = "discard-dead-letters"
)

// AllCapabilities returns every Capability, in a new slice. The in-memory
// engine of pubsub.NewBroker has them all.
func AllCapabilities() []Capability {
	return []Capability{Synctest, InjectedClock, CustomIDs, ExactBlock, ReclaimOnCommit, GiveBack, DropOldest, MaxAge, MaxBytes,
		Snapshots, Observed, Redrive, StuckDetection, Batches, Delete, DiscardDeadLetters}
}

// RunConformance checks that e keeps every guarantee of the logbus
// documentation (the module's doc.go and the pubsub API) through the public
// API only: per-key ordering, consumer groups, at-least-once delivery,
// retries and dead letters, retention and backpressure, start positions,
// seek and replay, pause, Drain, Close, streams, batch consumers, the
// error contract and typed keys. An engine author calls it from a test:
//
//	func TestConformance(t *testing.T) {
//		conformance.RunConformance(t, conformance.Engine{
//			Name:         "remote",
//			NewBroker:    newRemoteBroker,
//			Capabilities: []conformance.Capability{conformance.CustomIDs},
//		})
//	}
//
// Each guarantee is a subtest named by a sentence, grouped by topic
// ("Ordering", "Retries and dead letters", ...), so go test -run can pick
// one. Every subtest builds its own broker with e.NewBroker. When e has
// Synctest, each subtest runs in its own testing/synctest bubble, except
// the few that hunt a race a bubble's scheduling would hide, which say so
// and run in real time. Without Synctest every subtest runs in real time:
// it waits on barriers (Drain, Recorder.WaitFor, channels), a timeout only
// bounds a failure (10s), and the short waits it does take are the
// engine's own (a BlockTimeout, a retry backoff, a context of tens of
// milliseconds that must end).
//
// A subtest that needs a Capability e lacks is skipped, naming it, and
// RunConformance logs a summary of every skip and why (shown with go test
// -v). It must be called from the test's goroutine; it does not call
// t.Parallel.
func RunConformance(t *testing.T, e Engine) {
	t.Helper()
	if e.NewBroker == nil {
		t.Fatalf("conformance: engine %q: NewBroker is nil", e.Name)
	}
	have := make(map[Capability]bool, len(e.Capabilities))
	for _, c := range e.Capabilities {
		if !slices.Contains(AllCapabilities(), c) {
			t.Fatalf("conformance: engine %q declares unknown capability %q; known: %v", e.Name, c, AllCapabilities())
		}
		have[c] = true
	}
	var ran int
	var skipped []string
	for _, g := range conformanceGroups() {
		t.Run(g.name, func(t *testing.T) {
			for _, tc := range g.cases {
				t.Run(tc.name, func(t *testing.T) {
					ran++
					if missing := tc.missing(have); len(missing) > 0 {
						skipped = append(skipped, fmt.Sprintf("%s: lacks %s", t.Name(), strings.Join(missing, ", ")))
						t.Skipf("engine %q lacks capability %s", e.Name, strings.Join(missing, ", "))
					}
					if have[Synctest] && !tc.realTime {
						synctest.Test(t, func(t *testing.T) { tc.run(newConf(t, e, true)) })
						return
					}
					tc.run(newConf(t, e, false))
				})
			}
		})
	}
	if len(skipped) == 0 {
		t.Logf("conformance: engine %q: %d conformance subtests, none skipped", e.Name, ran)
		return
	}
	t.Logf("conformance: engine %q: %d conformance subtests, %d skipped for lack of a capability:\n\t%s",
		e.Name, ran, len(skipped), strings.Join(skipped, "\n\t"))
}

// confGroup is one heading of the suite.
type confGroup struct {
	name  string
	cases []confCase
}

// confCase is one guarantee, checked by run.
type confCase struct {
	name  string       // the guarantee, as a sentence
	needs []Capability // what the engine must declare for it to run
	// realTime runs the case outside a bubble even under Synctest: it
	// hunts a race that a bubble's scheduling hides.
	realTime bool
	run      func(c *conf)
}

func (tc confCase) missing(have map[Capability]bool) []string {
	var out []string
	for _, n := range tc.needs {
		if !have[n] {
			out = append(out, string(n))
		}
	}
	return out
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
	}
}
