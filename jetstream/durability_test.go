package jetstream

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/logbus/logbus/codec"
	"github.com/logbus/logbus/pubsub"
	"github.com/logbus/logbus/pubsub/pubsubtest"
)

// TestDurability publishes, handles part of it (one record dead-lettered),
// closes the broker and shuts the server down, then starts a new server on
// the same store directory: the records, the group's committed offsets
// and its dead letter are all there, and delivery resumes where it
// stopped, on file storage.
func TestDurability(t *testing.T) {
	dir := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	opts := []Option{WithPrefix("durable"), WithAckWait(2 * time.Second), WithMemberTTL(time.Second),
		WithPollWait(50 * time.Millisecond)}

	// First life: 10 records on 2 partitions; the group handles the first
	// 6 it sees of each partition (one of them a poison record), then the
	// broker closes.
	srv, err := StartServer(dir)
	if err != nil {
		t.Fatal(err)
	}
	b := pubsub.NewBroker(pubsub.WithEngine(srv.Engine(opts...)))
	orders, err := pubsub.NewTopic(b, "orders", codec.String(), codec.String(), pubsub.WithPartitions(2))
	if err != nil {
		t.Fatal(err)
	}
	var published []pubsub.Position
	for i := range 10 {
		pos, err := orders.Publish(ctx, fmt.Sprint("key-", i%2), fmt.Sprint("v", i))
		if err != nil {
			t.Fatal(err)
		}
		published = append(published, pos)
	}
	first := pubsubtest.NewRecorder[string]()
	first.FailWith(func(m pubsub.Message[string]) error {
		if m.Value == "v2" {
			return fmt.Errorf("poison: %w", pubsub.ErrPermanent)
		}
		return nil
	})
	g, err := orders.Subscribe("billing", "b1", first)
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Drain(ctx); err != nil {
		t.Fatal(err)
	}
	committed := []int64{g.Committed(0), g.Committed(1)}
	if committed[0]+committed[1] != 10 {
		t.Fatalf("committed %v after Drain, want 10 records in all", committed)
	}
	if err := b.Close(ctx); err != nil {
		t.Fatal(err)
	}
	// Records published while no broker reads them.
	b2 := pubsub.NewBroker(pubsub.WithEngine(srv.Engine(opts...)))
	orders2, err := pubsub.NewTopic(b2, "orders", codec.String(), codec.String(), pubsub.WithPartitions(2))
	if err != nil {
		t.Fatal(err)
	}
	var later []string
	for i := 10; i < 14; i++ {
		if _, err := orders2.Publish(ctx, fmt.Sprint("key-", i%2), fmt.Sprint("v", i)); err != nil {
			t.Fatal(err)
		}
		later = append(later, fmt.Sprint("v", i))
	}
	if err := b2.Close(ctx); err != nil {
		t.Fatal(err)
	}
	srv.Shutdown()

	// Second life, on the same directory.
	srv, err = StartServer(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Shutdown()
	b = pubsub.NewBroker(pubsub.WithEngine(srv.Engine(opts...)))
	defer b.Close(ctx)
	orders, err = pubsub.NewTopic(b, "orders", codec.String(), codec.String(), pubsub.WithPartitions(2))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pubsub.NewTopic(b, "orders", codec.String(), codec.String(), pubsub.WithPartitions(3)); !errors.Is(err, pubsub.ErrTopicExists) {
		t.Errorf("NewTopic with another partition count: got %v, want ErrTopicExists", err)
	}
	st := orders.Stats()
	if st.Published != 14 || st.Retained != 14 {
		t.Errorf("topic stats after the restart: %+v, want 14 published and retained", st)
	}
	second := pubsubtest.NewRecorder[string]()
	g, err = orders.Subscribe("billing", "b1", second)
	if err != nil {
		t.Fatal(err)
	}
	dl := g.DeadLetters()
	if len(dl) != 1 || dl[0].Message.Value != "v2" || !errors.Is(dl[0].Err, pubsub.ErrPermanent) || dl[0].Attempts != 1 {
		t.Errorf("dead letters after the restart: %+v, want v2 after 1 attempt, wrapping ErrPermanent", dl)
	}
	if want := published[2]; len(dl) == 1 && (dl[0].Message.Partition != want.Partition || dl[0].Message.Offset != want.Offset) {
		t.Errorf("dead letter at partition %d offset %d, want %d, %d", dl[0].Message.Partition, dl[0].Message.Offset, want.Partition, want.Offset)
	}
	if err := b.Drain(ctx); err != nil {
		t.Fatal(err)
	}
	got := second.Values()
	slices.Sort(got)
	slices.Sort(later)
	if !slices.Equal(got, later) {
		t.Errorf("after the restart the group handled %q, want only what it had not committed: %q", got, later)
	}
	for _, m := range second.Messages() {
		if m.Attempt != 1 {
			t.Errorf("%s delivered with attempt %d after a clean restart, want 1", m.Value, m.Attempt)
		}
	}
	if c0, c1 := g.Committed(0), g.Committed(1); c0+c1 != 14 {
		t.Errorf("committed %d, %d at the end, want 14 in all", c0, c1)
	}
}

// TestNames checks that names NATS forbids are encoded, not refused, and
// that distinct names never share a server name.
func TestNames(t *testing.T) {
	b := newBroker(t)
	ctx := t.Context()
	var mu sync.Mutex
	seen := map[string]string{}
	for _, name := range []string{"a.b", "a_2Eb", "a b", "a*>/\\", "ünï", "a_b", "a-b", "A"} {
		topic, err := pubsub.NewTopic(b, name, codec.String(), codec.String())
		if err != nil {
			t.Fatalf("NewTopic(%q): %v", name, err)
		}
		if _, err := topic.Publish(ctx, "k", name); err != nil {
			t.Fatalf("Publish to %q: %v", name, err)
		}
		rec := pubsubtest.NewRecorder[string]()
		if _, err := topic.Subscribe(name+" group.*", name+" consumer>", rec); err != nil {
			t.Fatalf("Subscribe on %q: %v", name, err)
		}
		if err := b.Drain(ctx); err != nil {
			t.Fatal(err)
		}
		if got := rec.Values(); !slices.Equal(got, []string{name}) {
			t.Errorf("topic %q delivered %q, want only its own record", name, got)
		}
		enc := encodeName(name)
		mu.Lock()
		if other, dup := seen[enc]; dup {
			t.Errorf("%q and %q encode to the same %q", name, other, enc)
		}
		seen[enc] = name
		mu.Unlock()
		if dec := decodeName(enc); dec != name {
			t.Errorf("decodeName(encodeName(%q)) = %q", name, dec)
		}
	}
	long := string(make([]byte, 300))
	if _, err := pubsub.NewTopic(b, long, codec.String(), codec.String()); !errors.Is(err, pubsub.ErrInvalid) {
		t.Errorf("NewTopic with a 300-byte name: got %v, want ErrInvalid", err)
	}
}
