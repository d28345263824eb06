// Package properties is logbus's property suite: a model-based,
// Jepsen-style test of an engine through the public API only, run with
// [RunProperties].
//
// rapid drives a state machine (publish.go, groups.go and streams.go; its
// model in model.go) against one broker and one topic whose shape
// (partitions, retention, retry policy) is drawn per run. Every action
// waits for the system to go quiet (synctest.Wait) before the next, so a
// run is a sequence of well-defined states that rapid can replay and
// shrink, while inside each action producers, workers, backoffs and
// rebalances still run concurrently. Everything runs in a testing/synctest
// bubble: backoffs, BlockTimeouts and age retention happen in virtual time,
// exactly and instantly. The broker's clock is the bubble's, read exactly
// (bubbleClock), so the model knows every record's Created and can tell
// where AtTime starts.
//
// Consumers come in two kinds. Handlers act out the fault their record
// carries. Streams are driven by the actions: a delivery is received (or
// left unread on the channel while other actions run), held across
// actions, acked or nacked, or given back by closing the stream. Groups
// start where a drawn Start says, and deliver one record of a partition at
// a time, or with a drawn WithKeyConcurrency(n) up to n, never two of one
// key: for those, per-key order stands in for the partition's order, and
// the commits must stay contiguous (never past an unsettled record, and
// up to the oldest one).
//
// Everything observable is appended to a history: publish results,
// deliveries with their outcome and epoch, dead letters, seeks. The
// invariants are checked over that history after every action, after every
// drain, and after Close. Each check is named for the invariant it guards,
// and its failure message shows the offending events.
//
// Vocabulary: an epoch of a (group, partition) is the span between two
// repositionings of its cursor: the group's creation at its Start, a Seek,
// a Replay. Within an epoch the cursor only moves forward. A delivery is a
// handler call, or a Stream delivery that a consumer received: it begins
// then, and ends with an outcome (see outcome). A Stream delivery waiting
// on the channel that nobody received is not one: when the group takes it
// back, nothing happened, and no attempt was counted.
//
// Timing: every wait in a run lasts whole milliseconds of virtual time
// (handlers, backoffs, BlockTimeouts, Advance, control-call deadlines), so
// all of it happens at whole milliseconds; only the final Close's deadline
// is half a millisecond off. So whether a handler ended before Close gave
// up, or before Close returned, is never a tie the scheduler decides.
package properties

import (
	"testing"

	"pgregory.net/rapid"

	"github.com/logbus/logbus/engine"
	"github.com/logbus/logbus/pubsub/pubsubtest/conformance"
)

// RunProperties runs the property suite on e: rapid drives a state machine
// of publishes (single, bursts from concurrent producers, batches), joins of
// handlers, batch consumers and Streams at drawn start positions (groups
// with and without WithKeyConcurrency), leaves,
// pauses, seeks, replays, faults (transient, permanent, panics, undecodable
// records, handlers that outlast Close) and virtual time, against one
// broker and one topic whose shape is drawn per run, and checks after every
// step the invariants of invariants.go. A failure is shrunk to a short
// sequence of actions and saved for replay, as rapid does; the number of
// runs is rapid's (100, or -rapid.checks, or RAPID_CHECKS).
//
// The model predicts every record's fate exactly (which record Block
// refuses, DropOldest evicts or MaxAge trims, what each attempt counts), so
// it needs an engine that keeps every capability of [engine.Capabilities]
// this suite knows, VirtualTime included, and declares none of them
// Untestable: they are read from the engine ([conformance.Capabilities]),
// and RunProperties skips an engine that lacks one, naming it. Each run
// builds its broker with e.NewBroker inside its own testing/synctest
// bubble, with the suite's options (a retry policy, WithClock, and in half
// the runs WithHooks, WithLogger and WithStuckAfter); the tb it passes
// routes cleanups and failures to the run.
func RunProperties(t *testing.T, e conformance.Engine) {
	t.Helper()
	have, untestable := conformance.Capabilities(t, e)
	if missing := needs &^ (have &^ untestable); missing != 0 {
		t.Skipf("properties: engine %q lacks %v, or declares it untestable: the property model predicts what only an engine with every capability does",
			e.Name, missing)
	}
	rapid.Check(t, func(rt *rapid.T) {
		rapid.SyncTest(rt, func(rt *rapid.T) {
			m := newMachine(rt, e, runTB{TB: t, run: rt})
			defer m.stop(rt) // inside the bubble, where the broker lives
			// Two rounds of actions (twice -rapid.steps on average): a
			// control call meets a held Stream delivery only after a join,
			// a publish and a receive, and the second round doubles how
			// often that happens, for about twice the time.
			actions := rapid.StateMachineActions(m)
			rt.Repeat(actions)
			rt.Repeat(actions)
			m.closeAndCheck(rt)
		})
	})
}

// needs is what the property model relies on: every capability an engine
// may have, as this suite was written.
const needs = engine.InjectedClock | engine.CustomIDs | engine.ExactBlock | engine.ReclaimOnCommit | engine.GiveBack |
	engine.VirtualTime | engine.Observed | engine.StuckDetection | engine.Batches | engine.DropsOldest | engine.MaxAge |
	engine.MaxBytes | engine.Snapshots | engine.Redrive | engine.Delete | engine.DiscardDeadLetters |
	engine.KeyConcurrency

// runTB is the testing.TB that [RunProperties] hands to Engine.NewBroker:
// cleanups, logs and failures go to the rapid run (whose cleanups run at
// the end of the run, inside its bubble), the rest to the test.
type runTB struct {
	testing.TB
	run *rapid.T
}

func (tb runTB) Cleanup(f func())                  { tb.run.Cleanup(f) }
func (tb runTB) Helper()                           { tb.run.Helper() }
func (tb runTB) Log(args ...any)                   { tb.run.Log(args...) }
func (tb runTB) Logf(format string, args ...any)   { tb.run.Logf(format, args...) }
func (tb runTB) Error(args ...any)                 { tb.run.Error(args...) }
func (tb runTB) Errorf(format string, args ...any) { tb.run.Errorf(format, args...) }
func (tb runTB) Fatal(args ...any)                 { tb.run.Fatal(args...) }
func (tb runTB) Fatalf(format string, args ...any) { tb.run.Fatalf(format, args...) }
func (tb runTB) Fail()                             { tb.run.Fail() }
func (tb runTB) FailNow()                          { tb.run.FailNow() }
func (tb runTB) Failed() bool                      { return tb.run.Failed() }
func (tb runTB) Skip(args ...any)                  { tb.run.Skip(args...) }
func (tb runTB) Skipf(format string, args ...any)  { tb.run.Skipf(format, args...) }
func (tb runTB) SkipNow()                          { tb.run.SkipNow() }
