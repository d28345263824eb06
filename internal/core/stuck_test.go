package core

import (
	"context"
	"errors"
	"testing"
	"testing/synctest"
	"time"

	"github.com/logbus/logbus/engine"
)

// With StuckAfter 2s the watchdog samples every second. A handler that
// begins at 0 is first seen at 1s, so it is reported at 3s, the first
// sample a whole threshold after that one, as running for 2s; a snapshot
// then says the same, and that it is in flight, not retrying. Release ends
// it, and the next sample says so.
func TestStuckIsReportedAThresholdAfterTheFirstSampleThatSawIt(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var log eventLog
		b := newBroker(t, Config{StuckAfter: 2 * time.Second, Observer: &log})
		topic := mustTopic(t, b, "t", TopicSpec{})
		release := make(chan struct{})
		subscribe(t, b, "t", "g", "c1", stuckHandler(release))
		publish(t, topic, "", "slow")

		time.Sleep(2500 * time.Millisecond)
		synctest.Wait()
		if got := log.of(engine.EventStuck); len(got) != 0 {
			t.Fatalf("at 2.5s: stuck events %+v, want none: the first sample to see it was at 1s", got)
		}
		time.Sleep(500 * time.Millisecond) // 3s: the sample that reports it
		synctest.Wait()
		stuck := log.of(engine.EventStuck)
		if len(stuck) != 1 {
			t.Fatalf("at 3s: stuck events %+v, want one", stuck)
		}
		if e := stuck[0]; e.Group != "g" || e.Consumer != "c1" || e.Partition != 0 || e.Offset != 0 || e.Attempt != 1 || e.Delay != 2*time.Second {
			t.Errorf("stuck event %+v, want g/c1 partition 0 offset 0, attempt 1, running for 2s", e)
		}
		ps := b.Snapshot().Topics[0].Groups[0].Partitions[0]
		if !ps.InFlight || ps.Retrying || ps.Attempt != 1 || ps.RunningFor != 2*time.Second {
			t.Errorf("snapshot %+v, want in flight, not retrying, attempt 1, running for 2s", ps)
		}

		close(release)
		time.Sleep(time.Second) // 4s: the next sample sees it ended
		synctest.Wait()
		unstuck := log.of(engine.EventUnstuck)
		if len(unstuck) != 1 || unstuck[0].Offset != 0 || unstuck[0].Delay != 3*time.Second {
			t.Errorf("unstuck events %+v, want one for offset 0 after 3s", unstuck)
		}
		ps = b.Snapshot().Topics[0].Groups[0].Partitions[0]
		if ps.InFlight || ps.Retrying || ps.Attempt != 0 || ps.RunningFor != 0 {
			t.Errorf("snapshot after the handler returned %+v, want nothing in flight or retrying", ps)
		}
	})
}

// A snapshot taken while a record waits out its backoff says it is
// retrying, with the attempt that failed, and not in flight.
func TestSnapshotShowsARetryingRecord(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBroker(t, Config{Retry: RetryPolicy{MaxAttempts: 3, BaseDelay: time.Minute}})
		topic := mustTopic(t, b, "t", TopicSpec{})
		failed := false
		subscribe(t, b, "t", "g", "c1", func(context.Context, *Delivery) error {
			if !failed {
				failed = true
				return errors.New("transient")
			}
			return nil
		})
		publish(t, topic, "", "flaky")
		synctest.Wait() // failed once, waiting out a minute
		ps := b.Snapshot().Topics[0].Groups[0].Partitions[0]
		if ps.InFlight || !ps.Retrying || ps.Attempt != 1 {
			t.Errorf("snapshot %+v, want retrying after attempt 1, not in flight", ps)
		}
		drain(t, b)
	})
}
