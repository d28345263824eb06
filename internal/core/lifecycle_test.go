package core

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"testing/synctest"
	"time"
)

// A deleted group keeps its hold on a partition while a worker of it still
// holds records: let go at once, the partition would reclaim the record
// under the handler and hand it to a producer to refill. The interleaving:
// the handler holds "a" past DeleteGroup's ctx; a producer waits for room
// (MaxMessages 1); only when the handler returned, with "a" intact, does the
// group let go and the producer append.
func TestDeletedGroupLetsGoOfItsPartitionOnlyWhenItsWorkerExits(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBroker(t, Config{})
		topic := mustTopic(t, b, "t", TopicSpec{Retention: Retention{MaxMessages: 1, BlockTimeout: time.Hour}})
		entered, release := make(chan struct{}), make(chan struct{})
		seen := make(chan string, 1)
		g := subscribe(t, b, "t", "g", "c1", func(_ context.Context, d *Delivery) error {
			close(entered)
			<-release // ignores ctx
			seen <- string(d.Record.Value)
			return nil
		})
		publish(t, topic, "", "a")
		<-entered
		published := make(chan error, 1)
		go func() {
			_, err := topic.Publish(context.Background(), nil, []byte("bbbb"), nil)
			published <- err
		}()
		synctest.Wait()

		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		if err := b.DeleteGroup(ctx, "t", "g"); !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("DeleteGroup: got %v, want an error wrapping context.DeadlineExceeded", err)
		}
		synctest.Wait()
		select {
		case err := <-published:
			t.Fatalf("the producer returned (%v) while the deleted group's handler still held its record", err)
		default:
		}
		b.offsets.mu.Lock()
		_, ok := b.offsets.cursors[OffsetKey{Group: "g", Topic: "t"}]
		b.offsets.mu.Unlock()
		if ok {
			t.Error("the deleted group's offset is still in the store")
		}

		close(release)
		if got := <-seen; got != "a" {
			t.Errorf("the handler's record read %q once it returned, want a: it was reused under it", got)
		}
		if err := <-published; err != nil {
			t.Errorf("the producer after the handler returned: %v", err)
		}
		synctest.Wait()
		p := topic.parts[0]
		p.mu.Lock()
		cursors := len(p.cursors)
		p.mu.Unlock()
		b.mu.Lock()
		retired := len(b.retired)
		b.mu.Unlock()
		if cursors != 0 || retired != 0 {
			t.Errorf("once its worker exited: %d cursors on the partition and %d retired groups, want none", cursors, retired)
		}
		if s := g.Stats(); s.Delivered != 0 {
			t.Errorf("the late ack counted: %+v, want nothing delivered (its commit fails)", s)
		}
	})
}

// Close waits for the handlers of a group deleted while they ran, as for
// any other group's: when Close returns, nothing of the broker runs.
func TestCloseWaitsForTheHandlerOfADeletedGroup(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBroker(t, Config{})
		topic := mustTopic(t, b, "t", TopicSpec{})
		entered, returned := make(chan struct{}), make(chan struct{})
		subscribe(t, b, "t", "g", "c1", func(context.Context, *Delivery) error {
			close(entered)
			time.Sleep(time.Minute) // ignores ctx
			close(returned)
			return nil
		})
		publish(t, topic, "", "a")
		<-entered
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		if err := b.DeleteGroup(ctx, "t", "g"); !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("DeleteGroup: got %v, want an error wrapping context.DeadlineExceeded", err)
		}
		if err := b.Close(context.Background()); err != nil {
			t.Errorf("Close: got %v, want nil: a deleted group leaves nothing unfinished", err)
		}
		select {
		case <-returned:
		default:
			t.Error("Close returned while the deleted group's handler still ran")
		}
	})
}

// A deleted group with lag holds up neither Drain nor Close, even paused.
func TestDeletedGroupHoldsUpNeitherDrainNorClose(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBroker(t, Config{})
		topic := mustTopic(t, b, "t", TopicSpec{})
		g := subscribe(t, b, "t", "g", "c1", func(context.Context, *Delivery) error { return nil })
		mustPause(t, g)
		publish(t, topic, "", "a")
		if err := b.Drain(context.Background()); !errors.Is(err, ErrStalled) {
			t.Fatalf("Drain with a paused group: got %v, want ErrStalled", err)
		}
		if err := b.DeleteGroup(context.Background(), "t", "g"); err != nil {
			t.Fatalf("DeleteGroup: %v", err)
		}
		if err := b.Drain(context.Background()); err != nil {
			t.Errorf("Drain once the group was deleted: %v", err)
		}
		if err := b.Close(context.Background()); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
}

// DeleteTopic refuses appends at once, with ErrTopicNotFound, through
// AppendOne and AppendBatch; after Close, ErrClosed says the broker stopped.
func TestDeletedTopicRefusesAppends(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBroker(t, Config{})
		topic := mustTopic(t, b, "t", TopicSpec{Partitions: 2})
		if err := b.DeleteTopic(context.Background(), "t"); err != nil {
			t.Fatalf("DeleteTopic: %v", err)
		}
		_, err := topic.AppendOne(context.Background(), 0, topic.NewRecord())
		wantErr(t, err, ErrTopicNotFound)
		n, err := topic.AppendBatch(context.Background(), []int{0, 1}, []*Record{topic.NewRecord(), topic.NewRecord()}, make([]int64, 2))
		if n != 0 || !errors.Is(err, ErrTopicNotFound) {
			t.Errorf("AppendBatch: got %d, %v; want 0 and ErrTopicNotFound", n, err)
		}
		again := mustTopic(t, b, "t", TopicSpec{})
		publish(t, again, "", "a")
		if err := b.Close(context.Background()); err != nil {
			t.Fatal(err)
		}
		_, err = topic.AppendOne(context.Background(), 0, topic.NewRecord())
		wantErr(t, err, ErrClosed)
	})
}

// DiscardDeadLetters whose ctx ends part way removes what match accepted
// until then, counts it, and says why it stopped.
func TestDiscardDeadLettersStopsWhenCtxEnds(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBroker(t, Config{})
		mustTopic(t, b, "t", TopicSpec{})
		g := subscribe(t, b, "t", "g", "c1", func(context.Context, *Delivery) error { return nil })
		for i := range 5 {
			g.dlq.add(DeadLetter{Record: &Record{Offset: int64(i), Value: fmt.Append(nil, i)}})
		}
		ctx, cancel := context.WithCancel(context.Background())
		calls := 0
		n, err := g.DiscardDeadLetters(ctx, func(*DeadLetter) bool {
			calls++
			if calls == 2 {
				cancel()
			}
			return true
		})
		if n != 2 || !errors.Is(err, context.Canceled) {
			t.Errorf("DiscardDeadLetters: got %d, %v; want 2 and context.Canceled", n, err)
		}
		latest, err := g.LatestDeadLetters(context.Background(), 10)
		if err != nil || len(latest) != 3 || latest[0].Record.Offset != 4 || latest[2].Record.Offset != 2 {
			t.Errorf("left: %d letters, %v; want offsets 4, 3, 2", len(latest), err)
		}
	})
}

// The stuck watchdog's probe yields no partition of a deleted group, so
// the watchdog forgets them (kit's TestWatchdogReportsAStuckDeliveryOnceAndItsEnd):
// groups made and deleted over and over leave nothing behind.
func TestStuckWatchdogForgetsDeletedGroups(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBroker(t, Config{StuckAfter: time.Second})
		mustTopic(t, b, "t", TopicSpec{Partitions: 2})
		subscribe(t, b, "t", "g", "c1", func(context.Context, *Delivery) error { return nil })
		yielded := func() (n int) {
			for range (stuckProbe{b}).Progress() {
				n++
			}
			return n
		}
		if n := yielded(); n != 2 {
			t.Fatalf("%d partitions sampled, want 2", n)
		}
		if err := b.DeleteGroup(context.Background(), "t", "g"); err != nil {
			t.Fatal(err)
		}
		if n := yielded(); n != 0 {
			t.Errorf("%d partitions sampled after DeleteGroup, want none", n)
		}
	})
}
