package jetstream

import (
	"context"
	"errors"
	"fmt"
	"hash/crc32"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/logbus/logbus/codec"
	"github.com/logbus/logbus/pubsub"
	"github.com/nats-io/nats.go"
)

// poisonLog is a handler that fails every "bad" value with ErrPermanent
// until fixed, and writes down every call.
type poisonLog struct {
	mu    sync.Mutex
	fixed bool
	calls []string // "<consumer> <value> p<partition>@<offset> attempt <n>"
}

func (l *poisonLog) handler(consumer string) pubsub.HandlerFunc[string] {
	return func(_ context.Context, m pubsub.Message[string]) error {
		l.mu.Lock()
		defer l.mu.Unlock()
		l.calls = append(l.calls, fmt.Sprintf("%s %s p%d@%d attempt %d", consumer, m.Value, m.Partition, m.Offset, m.Attempt))
		if strings.HasPrefix(m.Value, "bad") && !l.fixed {
			return fmt.Errorf("poison %s: %w", m.Value, pubsub.ErrPermanent)
		}
		return nil
	}
}

func (l *poisonLog) fix() {
	l.mu.Lock()
	l.fixed = true
	l.mu.Unlock()
}

// of returns the calls for value, in order.
func (l *poisonLog) of(value string) []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []string
	for _, c := range l.calls {
		if strings.Fields(c)[1] == value {
			out = append(out, c)
		}
	}
	return out
}

// TestRedrivenLetterSurvivesARestart redrives a dead letter while its
// group is paused, so it is queued on the server but not delivered (Drain
// says the group is stalled), then closes the broker and restarts the
// server on the same store directory: the letter is still queued
// (Snapshot's Redriving), no longer a dead letter, and once the group
// resumes it is delivered once, attempt 1, at its original offset, and
// nothing else is delivered again.
func TestRedrivenLetterSurvivesARestart(t *testing.T) {
	dir := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	opts := []Option{WithPrefix("redrive"), WithAckWait(2 * time.Second), WithMemberTTL(time.Second),
		WithPollWait(50 * time.Millisecond)}
	log := &poisonLog{}

	srv, err := StartServer(dir)
	if err != nil {
		t.Fatal(err)
	}
	b := pubsub.NewBroker(pubsub.WithEngine(srv.Engine(opts...)))
	orders, err := pubsub.NewTopic(b, "orders", codec.String(), codec.String(), pubsub.WithPartitions(2))
	if err != nil {
		t.Fatal(err)
	}
	g, err := orders.Subscribe("billing", "b1", log.handler("b1"))
	if err != nil {
		t.Fatal(err)
	}
	var bad pubsub.Position
	for i, v := range []string{"ok-1", "bad", "ok-2"} {
		pos, err := orders.Publish(ctx, fmt.Sprint("key-", i), v)
		if err != nil {
			t.Fatal(err)
		}
		if v == "bad" {
			bad = pos
		}
	}
	if err := b.Drain(ctx); err != nil {
		t.Fatal(err)
	}
	if dl := g.DeadLetters(); len(dl) != 1 || dl[0].Message.Value != "bad" {
		t.Fatalf("dead letters %+v, want the bad record", dl)
	}
	if err := g.Pause(ctx); err != nil {
		t.Fatal(err)
	}
	log.fix()
	if n, err := g.Redrive(ctx, nil); n != 1 || err != nil {
		t.Fatalf("Redrive: %d, %v; want 1, nil", n, err)
	}
	if dl := g.DeadLetters(); len(dl) != 0 {
		t.Errorf("dead letters after Redrive: %+v, want none", dl)
	}
	if got := redrivingOn(b, bad.Partition); got != 1 {
		t.Errorf("Redriving on partition %d: %d, want 1", bad.Partition, got)
	}
	if err := b.Drain(ctx); !errors.Is(err, pubsub.ErrStalled) {
		t.Errorf("Drain with a redriven letter in a paused group: %v, want ErrStalled", err)
	}
	_ = b.Close(ctx) // the paused group is stalled: what Close says of it is not the point
	srv.Shutdown()
	if got := log.of("bad"); len(got) != 1 {
		t.Fatalf("calls for the bad record before the restart: %q, want the one that failed", got)
	}

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
	g, err = orders.Subscribe("billing", "b1", log.handler("b1"))
	if err != nil {
		t.Fatal(err)
	}
	if got := redrivingOn(b, bad.Partition); got != 1 {
		t.Errorf("Redriving on partition %d after the restart: %d, want 1", bad.Partition, got)
	}
	if err := g.Resume(ctx); err != nil {
		t.Fatal(err)
	}
	if err := b.Drain(ctx); err != nil {
		t.Fatal(err)
	}
	want := []string{
		fmt.Sprintf("b1 bad p%d@%d attempt 1", bad.Partition, bad.Offset),
		fmt.Sprintf("b1 bad p%d@%d attempt 1", bad.Partition, bad.Offset),
	}
	if got := log.of("bad"); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("calls for the bad record: %q, want %q", got, want)
	}
	for _, v := range []string{"ok-1", "ok-2"} {
		if got := log.of(v); len(got) != 1 {
			t.Errorf("calls for %s: %q, want one: a redrive redelivers nothing else", v, got)
		}
	}
	if got := redrivingOn(b, bad.Partition); got != 0 {
		t.Errorf("Redriving after the drain: %d, want 0", got)
	}
	if dl := g.DeadLetters(); len(dl) != 0 {
		t.Errorf("dead letters at the end: %+v, want none", dl)
	}
}

// redrivingOn is the Snapshot's Redriving of the only group's partition p.
func redrivingOn(b *pubsub.Broker, p int) int {
	s := b.Snapshot()
	if len(s.Topics) != 1 || len(s.Topics[0].Groups) != 1 {
		return -1
	}
	return s.Topics[0].Groups[0].Partitions[p].Redriving
}

// TestRedriveGoesToThePartitionOwner runs a group over two brokers, each
// on a connection of its own, with one dead letter on each of four
// partitions. The first broker redrives them all: each letter is
// delivered once more, attempt 1, by the member that owns its partition
// (half of them in the other broker), and another group sees nothing.
func TestRedriveGoesToThePartitionOwner(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	opts := testOptions()
	conn := func() *nats.Conn {
		nc, err := testServer.Connect()
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(nc.Close)
		return nc
	}
	broker := func() (*pubsub.Broker, *pubsub.Topic[string, string]) {
		e, err := Connect(conn(), opts...)
		if err != nil {
			t.Fatal(err)
		}
		b := brokerOn(t, e)
		tp, err := pubsub.NewTopic(b, "orders", codec.String(), codec.String(), pubsub.WithPartitions(4))
		if err != nil {
			t.Fatal(err)
		}
		return b, tp
	}
	b1, t1 := broker()
	b2, t2 := broker()
	log, audit := &poisonLog{}, &poisonLog{}
	g1, err := t1.Subscribe("billing", "c1", log.handler("c1"))
	if err != nil {
		t.Fatal(err)
	}
	g2, err := t2.Subscribe("billing", "c2", log.handler("c2"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := t1.Subscribe("audit", "a1", audit.handler("a1")); err != nil {
		t.Fatal(err)
	}
	waitAgree(ctx, t, g1, g2)
	owner := map[int]string{}
	for c, ps := range g1.Assignment() {
		for _, p := range ps {
			owner[p] = c
		}
	}
	if len(owner) != 4 || len(g1.Assignment()["c1"]) != 2 {
		t.Fatalf("assignment %v, want two partitions each", g1.Assignment())
	}
	// One bad record and one good per partition: keys picked by the
	// typed layer's hash (CRC-32 of the key).
	badAt := map[string]pubsub.Position{}
	seen := map[uint32]bool{}
	for i := 0; len(seen) < 4; i++ {
		key := fmt.Sprint("key-", i)
		if seen[crc32.ChecksumIEEE([]byte(key))%4] {
			continue
		}
		seen[crc32.ChecksumIEEE([]byte(key))%4] = true
		pos, err := t1.Publish(ctx, key, fmt.Sprint("bad-", i))
		if err != nil {
			t.Fatal(err)
		}
		badAt[fmt.Sprint("bad-", i)] = pos
		if _, err := t1.Publish(ctx, key, fmt.Sprint("ok-", i)); err != nil {
			t.Fatal(err)
		}
	}
	if err := b1.Drain(ctx); err != nil {
		t.Fatal(err)
	}
	if err := b2.Drain(ctx); err != nil {
		t.Fatal(err)
	}
	if n := len(g1.DeadLetters()); n != 4 {
		t.Fatalf("%d dead letters, want 4", n)
	}
	log.fix()
	if n, err := g1.Redrive(ctx, nil); n != 4 || err != nil {
		t.Fatalf("Redrive: %d, %v; want 4, nil", n, err)
	}
	if err := b1.Drain(ctx); err != nil {
		t.Fatal(err)
	}
	if err := b2.Drain(ctx); err != nil {
		t.Fatal(err)
	}
	for v, pos := range badAt {
		got := log.of(v)
		if len(got) != 2 {
			t.Errorf("calls for %s: %q, want the failed one and one redriven", v, got)
			continue
		}
		want := fmt.Sprintf("%s %s p%d@%d attempt 1", owner[pos.Partition], v, pos.Partition, pos.Offset)
		if got[1] != want {
			t.Errorf("redriven %s: %q, want %q (its partition's owner)", v, got[1], want)
		}
		if a := audit.of(v); len(a) != 1 {
			t.Errorf("audit calls for %s: %q, want one: a redrive is billing's only", v, a)
		}
	}
	if s1, s2 := g1.Stats(), g2.Stats(); s1.Redriven != 4 || s2.Redriven != 0 {
		t.Errorf("Redriven: %d on the broker that redrove, %d on the other; want 4 and 0", s1.Redriven, s2.Redriven)
	}
	if n := len(g2.DeadLetters()); n != 0 {
		t.Errorf("%d dead letters left, want none", n)
	}
}

// TestRedriveAfterClose fails with ErrClosed.
func TestRedriveAfterClose(t *testing.T) {
	b := newBroker(t)
	orders, err := pubsub.NewTopic(b, "orders", codec.String(), codec.String())
	if err != nil {
		t.Fatal(err)
	}
	g, err := orders.Subscribe("billing", "b1", (&poisonLog{}).handler("b1"))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := b.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if n, err := g.Redrive(ctx, nil); n != 0 || !errors.Is(err, pubsub.ErrClosed) {
		t.Errorf("Redrive after Close: %d, %v; want 0, ErrClosed", n, err)
	}
}

// TestRedrivenLetterOfACrashedMember redrives a dead letter to the member
// that owns its partition, whose connection dies while its handler runs
// on the letter: the other member takes the partition over and delivers
// the letter, with the attempt after the one that was cut short, and the
// group drains.
func TestRedrivenLetterOfACrashedMember(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	opts := testOptions()
	hang := make(chan struct{})
	started := make(chan struct{}, 1)
	var mu sync.Mutex
	var calls []string
	handler := func(consumer string) pubsub.HandlerFunc[string] {
		return func(_ context.Context, m pubsub.Message[string]) error {
			mu.Lock()
			calls = append(calls, fmt.Sprintf("%s %s attempt %d", consumer, m.Value, m.Attempt))
			n := len(calls)
			mu.Unlock()
			switch {
			case n == 1: // the first delivery fails for good
				return pubsub.ErrPermanent
			case consumer == "c2": // the redriven letter: c2 hangs until its connection is gone
				started <- struct{}{}
				<-hang
				return errors.New("cut short")
			}
			return nil
		}
	}
	var nc2 *nats.Conn
	broker := func(name string) (*pubsub.Broker, *pubsub.Topic[string, string], *pubsub.Group[string]) {
		nc, err := testServer.Connect()
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(nc.Close)
		if name == "c2" {
			nc2 = nc
		}
		e, err := Connect(nc, opts...)
		if err != nil {
			t.Fatal(err)
		}
		b := brokerOn(t, e)
		tp, err := pubsub.NewTopic(b, "orders", codec.String(), codec.String(), pubsub.WithPartitions(2))
		if err != nil {
			t.Fatal(err)
		}
		g, err := tp.Subscribe("billing", name, handler(name))
		if err != nil {
			t.Fatal(err)
		}
		return b, tp, g
	}
	b1, tp1, g1 := broker("c1")
	_, _, g2 := broker("c2")
	t.Cleanup(func() { close(hang) }) // before the brokers close: c2's handler returns
	waitAgree(ctx, t, g1, g2)
	p := g1.Assignment()["c2"][0]
	key := ""
	for i := 0; key == ""; i++ {
		if k := fmt.Sprint("key-", i); int(crc32.ChecksumIEEE([]byte(k))%2) == p {
			key = k
		}
	}
	if _, err := tp1.Publish(ctx, key, "bad"); err != nil {
		t.Fatal(err)
	}
	if err := b1.Drain(ctx); err != nil {
		t.Fatal(err)
	}
	if n, err := g1.Redrive(ctx, nil); n != 1 || err != nil {
		t.Fatalf("Redrive: %d, %v; want 1, nil", n, err)
	}
	select {
	case <-started:
	case <-ctx.Done():
		t.Fatal("c2 never got the redriven letter")
	}
	nc2.Close() // c2's process dies mid-handler
	if err := b1.Drain(ctx); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	// The first delivery may be c1's: it owned both partitions until c2
	// joined, and finishes a record it fetched meanwhile.
	want := []string{"c2 bad attempt 1", "c1 bad attempt 2"}
	if len(calls) != 3 || fmt.Sprint(calls[1:]) != fmt.Sprint(want) {
		t.Errorf("calls %q, want the failed delivery, then %q: the redriven one cut short, then the new owner's", calls, want)
	}
}

// TestRedrivenLetterGoesFirst redrives a dead letter while a handler runs
// on the partition and more records wait behind it: once the handler
// returns, the letter is delivered before them.
func TestRedrivenLetterGoesFirst(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	b := newBroker(t)
	orders, err := pubsub.NewTopic(b, "orders", codec.String(), codec.String())
	if err != nil {
		t.Fatal(err)
	}
	log := &poisonLog{}
	gate, release := make(chan struct{}), make(chan struct{})
	h := log.handler("b1")
	g, err := orders.Subscribe("billing", "b1", pubsub.HandlerFunc[string](func(ctx context.Context, m pubsub.Message[string]) error {
		if m.Value == "gate" {
			close(gate)
			<-release
		}
		return h(ctx, m)
	}))
	if err != nil {
		t.Fatal(err)
	}
	publish := func(vs ...string) {
		for _, v := range vs {
			if _, err := orders.Publish(ctx, "k", v); err != nil {
				t.Fatal(err)
			}
		}
	}
	publish("bad")
	if err := b.Drain(ctx); err != nil {
		t.Fatal(err)
	}
	log.fix()
	publish("gate")
	<-gate
	if n, err := g.Redrive(ctx, nil); n != 1 || err != nil {
		t.Fatalf("Redrive: %d, %v; want 1, nil", n, err)
	}
	publish("after-1", "after-2")
	close(release)
	if err := b.Drain(ctx); err != nil {
		t.Fatal(err)
	}
	log.mu.Lock()
	defer log.mu.Unlock()
	want := []string{"b1 bad p0@0 attempt 1", "b1 gate p0@1 attempt 1", "b1 bad p0@0 attempt 1",
		"b1 after-1 p0@2 attempt 1", "b1 after-2 p0@3 attempt 1"}
	if fmt.Sprint(log.calls) != fmt.Sprint(want) {
		t.Errorf("calls %q, want %q", log.calls, want)
	}
}

// TestRedriveToABatchConsumer redrives a letter of a batch consumer: it
// comes back alone, as a batch of one, attempt 1, and fails again into the
// dead letters when it fails again.
func TestRedriveToABatchConsumer(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	b := newBroker(t)
	orders, err := pubsub.NewTopic(b, "orders", codec.String(), codec.String())
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var batches []string
	g, err := orders.SubscribeBatch("billing", "b1", pubsub.BatchHandlerFunc[string](func(_ context.Context, msgs []pubsub.Message[string]) error {
		mu.Lock()
		defer mu.Unlock()
		var vs []string
		for _, m := range msgs {
			vs = append(vs, fmt.Sprintf("%s@%d#%d", m.Value, m.Offset, m.Attempt))
		}
		batches = append(batches, strings.Join(vs, " "))
		for i, m := range msgs {
			if m.Value == "bad" {
				return &pubsub.BatchError{Index: i, Err: pubsub.ErrPermanent}
			}
		}
		return nil
	}), pubsub.WithBatchSize(10))
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range []string{"ok-1", "bad", "ok-2"} {
		if _, err := orders.Publish(ctx, "k", v); err != nil {
			t.Fatal(err)
		}
	}
	if err := b.Drain(ctx); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	before := len(batches)
	mu.Unlock()
	if n, err := g.Redrive(ctx, nil); n != 1 || err != nil {
		t.Fatalf("Redrive: %d, %v; want 1, nil", n, err)
	}
	if err := b.Drain(ctx); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if got := batches[before:]; fmt.Sprint(got) != "[bad@1#1]" {
		t.Errorf("batches after Redrive %q, want one batch of the letter alone, attempt 1", got)
	}
	if dl := g.DeadLetters(); len(dl) != 1 || dl[0].Message.Offset != 1 || dl[0].Attempts != 1 {
		t.Errorf("dead letters %+v, want the letter again, after its one attempt", dl)
	}
	if s := g.Stats(); s.Redriven != 1 || s.DeadLettered != 2 {
		t.Errorf("stats %+v, want 1 redriven and 2 dead-lettered", s)
	}
}
