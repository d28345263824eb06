package pubsub_test

import (
	"context"
	"errors"
	"slices"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/logbus/logbus/codec"
	"github.com/logbus/logbus/pubsub"
	"github.com/logbus/logbus/pubsub/pubsubtest"
)

// The snapshot of a broker with a busy group, a failing group and a paused
// group says, per partition, who owns it, what is committed, how far
// behind each group is in records and in time, what is in flight and at
// which attempt, and how many dead letters each group holds.
func TestSnapshotDescribesTopicsAndGroups(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		start := time.Date(2026, 12, 3, 12, 0, 0, 0, time.UTC)
		clock := pubsubtest.NewClock(start)
		b := pubsubtest.NewBroker(t, pubsub.WithClock(clock))
		orders := mustTopic(t, b, "orders", codec.String(), codec.Int[int](), pubsub.WithPartitions(2),
			pubsub.WithPartitioner(partitionerFunc(func(key []byte, n int) int { return int(key[0]-'0') % n })))
		mustTopic(t, b, "audit", codec.String(), codec.String())

		// billing holds the first record of partition 0 until released.
		release := make(chan struct{})
		billing := mustSubscribe(t, orders, "billing", "b1", pubsub.HandlerFunc[int](func(ctx context.Context, m pubsub.Message[int]) error {
			if m.Partition == 0 && m.Offset == 0 {
				<-release
			}
			return nil
		}))
		// flaky fails everything once, permanently.
		flaky := mustSubscribe(t, orders, "flaky", "f1", pubsub.HandlerFunc[int](func(context.Context, pubsub.Message[int]) error {
			return pubsub.ErrPermanent
		}))
		paused := mustSubscribe(t, orders, "paused", "p1", pubsub.HandlerFunc[int](func(context.Context, pubsub.Message[int]) error { return nil }))
		if err := paused.Pause(context.Background()); err != nil {
			t.Fatal(err)
		}
		mustPublish(t, orders, "0", 1) // partition 0, offset 0
		clock.Advance(time.Second)
		mustPublish(t, orders, "0", 2) // partition 0, offset 1
		mustPublish(t, orders, "1", 3) // partition 1, offset 0
		clock.Advance(4 * time.Second)
		synctest.Wait()

		s := b.Snapshot()
		if s.Partial || s.State != pubsub.Running || !s.Taken.Equal(start.Add(5*time.Second)) {
			t.Errorf("snapshot: Partial %v State %v Taken %v, want false, running, %v", s.Partial, s.State, s.Taken, start.Add(5*time.Second))
		}
		if got := topicNames(s); !slices.Equal(got, []string{"audit", "orders"}) {
			t.Fatalf("topics %v, want [audit orders]", got)
		}
		ot := s.Topics[1]
		if ot.Stats.Published != 3 || len(ot.Partitions) != 2 || ot.Partitions[0].End != 2 || ot.Partitions[1].Retained != 1 {
			t.Errorf("orders: stats %+v partitions %+v, want 3 published, partition 0 ends at 2, partition 1 holds 1", ot.Stats, ot.Partitions)
		}
		if got := groupNames(ot); !slices.Equal(got, []string{"billing", "flaky", "paused"}) {
			t.Fatalf("groups %v, want [billing flaky paused]", got)
		}
		bg, fg, pg := ot.Groups[0], ot.Groups[1], ot.Groups[2]

		bp := bg.Partitions[0]
		if !bp.InFlight || bp.Attempt != 1 || bp.Committed != 0 || bp.Lag != 2 || bp.Owner != "b1" ||
			!bp.Oldest.Equal(start) || bp.LagAge != 5*time.Second {
			t.Errorf("billing partition 0: %+v, want in flight at attempt 1, committed 0, lag 2, owner b1, oldest %v, lag age 5s", bp, start)
		}
		if bq := bg.Partitions[1]; bq.InFlight || bq.Lag != 0 || !bq.Oldest.IsZero() || bq.LagAge != 0 {
			t.Errorf("billing partition 1: %+v, want idle with no lag", bq)
		}
		if bg.Lag != 2 || bg.LagAge != 5*time.Second || !slices.Equal(bg.Consumers, []string{"b1"}) ||
			!slices.Equal(bg.Assignment["b1"], []int{0, 1}) || bg.Stats.Delivered != 1 {
			t.Errorf("billing: %+v, want lag 2, lag age 5s, b1 owning 0 and 1, 1 delivered", bg)
		}
		if fg.DeadLetters != 3 || fg.Stats.DeadLettered != 3 || fg.Lag != 0 {
			t.Errorf("flaky: %d dead letters, stats %+v, lag %d; want 3, 3 and 0", fg.DeadLetters, fg.Stats, fg.Lag)
		}
		if !pg.Paused || pg.Lag != 3 || pg.Partitions[1].LagAge != 4*time.Second {
			t.Errorf("paused: %+v, want paused, lag 3, partition 1 waiting 4s", pg)
		}
		if got := billing.Lag(); got != bg.Lag {
			t.Errorf("Group.Lag %d, snapshot %d: want equal", got, bg.Lag)
		}
		_ = flaky

		close(release)
		if err := paused.Resume(context.Background()); err != nil {
			t.Fatal(err)
		}
		pubsubtest.Drain(t, b)
		for _, g := range b.Snapshot().Topics[1].Groups {
			for _, p := range g.Partitions {
				if p.InFlight || p.Lag != 0 || p.LagAge != 0 {
					t.Errorf("after Drain, group %s partition %d: %+v, want nothing in flight and no lag", g.Name, p.Partition, p)
				}
			}
		}
		if err := b.Close(context.Background()); err != nil {
			t.Fatal(err)
		}
		if s := b.Snapshot(); s.State != pubsub.Stopped || len(s.Topics) != 2 {
			t.Errorf("after Close: state %v, %d topics; want stopped and still 2", s.State, len(s.Topics))
		}
	})
}

// A record waiting out a retry backoff shows as Retrying, with the attempt
// that failed.
func TestSnapshotShowsRetries(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := pubsubtest.NewBroker(t, pubsub.WithRetry(pubsub.RetryPolicy{MaxAttempts: 5, BaseDelay: time.Minute, MaxDelay: time.Hour}))
		topic := mustTopic(t, b, "t", codec.String(), codec.Int[int]())
		var fail atomic.Bool
		fail.Store(true)
		mustSubscribe(t, topic, "g", "c", pubsub.HandlerFunc[int](func(context.Context, pubsub.Message[int]) error {
			if fail.Load() {
				return errors.New("not yet")
			}
			return nil
		}))
		mustPublish(t, topic, "k", 1)
		synctest.Wait()
		time.Sleep(time.Minute) // the first backoff: attempt 2 fails, and waits 2 minutes
		synctest.Wait()
		p := b.Snapshot().Topics[0].Groups[0].Partitions[0]
		if !p.Retrying || p.InFlight || p.Attempt != 2 {
			t.Errorf("partition: %+v, want retrying after attempt 2", p)
		}
		fail.Store(false)
		drainHour(t, b)
	})
}

// An engine that cannot describe itself gives a Partial snapshot: the
// topics and groups made through the Broker, with what every engine
// reports.
func TestSnapshotOfAnEngineThatCannotDescribeItself(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := pubsubtest.NewBroker(t, pubsub.WithEngine(lesser{}))
		topic := mustTopic(t, b, "orders", codec.String(), codec.Int[int](), pubsub.WithPartitions(2))
		g := mustSubscribe(t, topic, "billing", "b1", pubsub.HandlerFunc[int](func(context.Context, pubsub.Message[int]) error { return nil }))
		mustPublish(t, topic, "alice", 1)
		pubsubtest.Drain(t, b)
		if err := g.Pause(context.Background()); err != nil {
			t.Fatal(err)
		}
		pos := mustPublish(t, topic, "alice", 2)
		s := b.Snapshot()
		if !s.Partial || len(s.Topics) != 1 || len(s.Topics[0].Groups) != 1 {
			t.Fatalf("snapshot %+v, want a Partial one with 1 topic and 1 group", s)
		}
		sg := s.Topics[0].Groups[0]
		sp := sg.Partitions[pos.Partition]
		if sg.Name != "billing" || sg.Lag != 1 || sp.Lag != 1 || sp.Committed != 1 || sp.Owner != "b1" || sg.Stats.Delivered != 1 {
			t.Errorf("group %+v, want billing with lag 1 on partition %d (committed 1, owner b1), 1 delivered", sg, pos.Partition)
		}
		for _, p := range sg.Partitions {
			if p.Owner != "b1" {
				t.Errorf("partition %d owned by %q, want b1 (the only consumer)", p.Partition, p.Owner)
			}
		}
		if err := g.Resume(context.Background()); err != nil {
			t.Fatal(err)
		}
		pubsubtest.Drain(t, b)
	})
}

// Without WithStuckAfter no delivery is called stuck, however long it runs.
func TestSnapshotCallsNothingStuckWithoutAThreshold(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := pubsubtest.NewBroker(t)
		topic := mustTopic(t, b, "orders", codec.String(), codec.Int[int]())
		release := make(chan struct{})
		mustSubscribe(t, topic, "billing", "b1", pubsub.HandlerFunc[int](func(context.Context, pubsub.Message[int]) error {
			<-release
			return nil
		}))
		mustPublish(t, topic, "alice", 1)
		time.Sleep(time.Hour)
		if p := b.Snapshot().Topics[0].Groups[0].Partitions[0]; !p.InFlight || p.Stuck {
			t.Errorf("snapshot: in flight %v, stuck %v; want in flight, not stuck", p.InFlight, p.Stuck)
		}
		close(release)
	})
}

func topicNames(s pubsub.Snapshot) []string {
	var out []string
	for _, t := range s.Topics {
		out = append(out, t.Name)
	}
	return out
}

func groupNames(t pubsub.TopicSnapshot) []string {
	var out []string
	for _, g := range t.Groups {
		out = append(out, g.Name)
	}
	return out
}

// When retention trimmed the oldest record a group has not committed, the
// snapshot still counts the lag in records, but has no age for it: the
// group will skip those records.
func TestSnapshotLagOfTrimmedRecordsHasNoAge(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b, topic := newTopic(t, "t",
			pubsub.WithRetention(pubsub.Retention{MaxMessages: 2, OnFull: pubsub.DropOldest}))
		g := mustSubscribe(t, topic, "g", "c", pubsub.HandlerFunc[string](func(context.Context, pubsub.Message[string]) error { return nil }))
		if err := g.Pause(context.Background()); err != nil {
			t.Fatal(err)
		}
		for range 5 {
			mustPublish(t, topic, "k", "v")
		}
		p := b.Snapshot().Topics[0].Groups[0].Partitions[0]
		if p.Lag != 5 || p.Committed != 0 || !p.Oldest.IsZero() || p.LagAge != 0 {
			t.Errorf("partition %+v, want lag 5 from offset 0 and no age (offsets 0-2 are gone)", p)
		}
		if err := g.Resume(context.Background()); err != nil {
			t.Fatal(err)
		}
		pubsubtest.Drain(t, b)
	})
}
