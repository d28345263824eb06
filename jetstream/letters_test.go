package jetstream

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/logbus/logbus/codec"
	"github.com/logbus/logbus/engine"
	"github.com/logbus/logbus/pubsub"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	natsjs "github.com/nats-io/nats.go/jetstream"
)

// rawGroup opens an engine of its own on srv with opts (the prefix of a
// broker under test, say), attaches to topic and returns group as that
// engine sees it: the view of another process, which has only what the
// server stored. Closed at cleanup.
func rawGroup(t testing.TB, srv *Server, opts []Option, topic string, parts int, name string) *group {
	t.Helper()
	return rawGroupOf(t, srv.Engine(opts...), topic, parts, name)
}

// rawGroupOf is rawGroup on the engine opener o.
func rawGroupOf(t testing.TB, o pubsub.Engine, topic string, parts int, name string) *group {
	t.Helper()
	ee, err := o.(*opener).Open(engine.Config{})
	if err != nil {
		t.Fatal(err)
	}
	e := ee.(*eng)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = e.Close(ctx)
	})
	if _, err := e.CreateTopic(ctx, topic, engine.TopicSpec{Partitions: parts}); err != nil {
		t.Fatal(err)
	}
	g, err := e.Group(ctx, topic, name)
	if err != nil {
		t.Fatal(err)
	}
	return g.(*group)
}

// letterHooks writes down the dead-letter events.
type letterHooks struct {
	mu     sync.Mutex
	events []pubsub.DeadLetterEvent
}

func (h *letterHooks) OnDeadLetter(e pubsub.DeadLetterEvent) {
	h.mu.Lock()
	h.events = append(h.events, e)
	h.mu.Unlock()
}

func (h *letterHooks) all() []pubsub.DeadLetterEvent {
	h.mu.Lock()
	defer h.mu.Unlock()
	return slices.Clone(h.events)
}

// calls counts a handler's calls by value.
type calls struct {
	mu sync.Mutex
	n  map[string]int
}

func (c *calls) add(v string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.n == nil {
		c.n = map[string]int{}
	}
	c.n[v]++
}

func (c *calls) of(v string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n[v]
}

// badThenNext subscribes consumer c1 of group g to topic (with opts),
// its handler failing the record "bad" with badErr and acking the rest,
// publishes "bad" then "next", drains, and checks each was handled once:
// the bad one given up on at once, the next one delivered behind it.
func badThenNext(ctx context.Context, t *testing.T, b *pubsub.Broker, topic *pubsub.Topic[string, string], badErr error, opts ...pubsub.SubscribeOption) *pubsub.Group[string] {
	t.Helper()
	var seen calls
	g, err := topic.Subscribe("g", "c1", pubsub.HandlerFunc[string](func(_ context.Context, m pubsub.Message[string]) error {
		seen.add(m.Value)
		if m.Value == "bad" {
			return badErr
		}
		return nil
	}), opts...)
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range []string{"bad", "next"} {
		if _, err := topic.Publish(ctx, "k", v); err != nil {
			t.Fatal(err)
		}
	}
	if err := b.Drain(ctx); err != nil {
		t.Fatal(err)
	}
	if seen.of("bad") != 1 || seen.of("next") != 1 {
		t.Errorf("handled bad %d times and next %d times, want once each", seen.of("bad"), seen.of("next"))
	}
	return g
}

// TestDeadLetterOfAValueNearMaxPayloadIsStoredWithoutIt: a record whose
// value is 300 bytes under the server's max_payload fits, but its dead
// letter (the record and about 400 bytes of headers) does not. It is
// stored without the value, Truncated with the value's size, once; the
// record behind it is delivered. Before, the store error was dropped and
// the handler ran again and again (Retried 0, the partition wedged).
// Redrive refuses the letter (its value is gone), with ErrInvalid, and
// leaves it.
func TestDeadLetterOfAValueNearMaxPayloadIsStoredWithoutIt(t *testing.T) {
	opts := testOptions()
	b := brokerOn(t, testServer.Engine(opts...))
	topic, err := pubsub.NewTopic(b, "big", codec.String(), codec.RawBytes())
	if err != nil {
		t.Fatal(err)
	}
	var seen calls
	g, err := topic.Subscribe("g", "c1", pubsub.HandlerFunc[[]byte](func(_ context.Context, m pubsub.Message[[]byte]) error {
		if len(m.Value) > 1000 {
			seen.add("big")
			return fmt.Errorf("too big to handle: %w", pubsub.ErrPermanent)
		}
		seen.add(string(m.Value))
		return nil
	}))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	nc, err := testServer.Connect()
	if err != nil {
		t.Fatal(err)
	}
	maxPayload := int(nc.MaxPayload())
	nc.Close()
	big := bytes.Repeat([]byte{'x'}, maxPayload-300)
	if _, err := topic.Publish(ctx, "k", big); err != nil {
		t.Fatalf("a value 300 bytes under max_payload: %v", err)
	}
	if _, err := topic.Publish(ctx, "k", []byte("next")); err != nil {
		t.Fatal(err)
	}
	if err := b.Drain(ctx); err != nil {
		t.Fatal(err)
	}
	if n := seen.of("big"); n != 1 {
		t.Errorf("the big record was handled %d times, want once", n)
	}
	if n := seen.of("next"); n != 1 {
		t.Errorf("the record behind it was handled %d times, want once", n)
	}
	if st := g.Stats(); st.DeadLettered != 1 || st.Retried != 0 || st.Delivered != 1 || st.DeadLettersEvicted != 0 {
		t.Errorf("stats %+v, want 1 dead-lettered, 0 retried, 1 delivered, 0 evicted", st)
	}
	dl := g.DeadLetters()
	if len(dl) != 1 {
		t.Fatalf("%d dead letters, want 1", len(dl))
	}
	if l := dl[0]; !l.Truncated || l.ValueSize != len(big) || l.Message.Value != nil || string(l.Message.Key) != "k" ||
		l.Attempts != 1 || !errors.Is(l.Err, pubsub.ErrPermanent) {
		t.Errorf("dead letter Truncated %v, ValueSize %d, %d value bytes, key %q, attempts %d, err %v; want truncated, %d, none, k, 1, ErrPermanent",
			l.Truncated, l.ValueSize, len(l.Message.Value), l.Message.Key, l.Attempts, l.Err, len(big))
	}
	// Another process reads the same from the server.
	raw := rawGroup(t, testServer, opts, "big", 1, "g")
	latest, err := raw.LatestDeadLetters(ctx, 5)
	if err != nil || len(latest) != 1 || !latest[0].Truncated || latest[0].ValueSize != len(big) || len(latest[0].Record.Value) != 0 {
		t.Errorf("LatestDeadLetters from another engine: %d letters, %v; want the truncated one", len(latest), err)
	}
	n, err := g.Redrive(ctx, nil)
	if n != 0 || !errors.Is(err, pubsub.ErrInvalid) {
		t.Errorf("Redrive of a truncated letter: %d, %v; want 0 and ErrInvalid", n, err)
	}
	if dl := g.DeadLetters(); len(dl) != 1 {
		t.Errorf("%d dead letters after the refused Redrive, want the one still there", len(dl))
	}
}

// TestDeadLetterErrorTextIsCut: a handler error of 100 KiB, more than the
// 64 KiB of headers the server takes, is stored cut to MaxErrorText, so
// the letter is stored and the next record delivered. This process keeps
// the whole error; another reads the cut text, which still matches
// ErrPermanent.
func TestDeadLetterErrorTextIsCut(t *testing.T) {
	opts := testOptions()
	b := brokerOn(t, testServer.Engine(opts...))
	topic, err := pubsub.NewTopic(b, "orders", codec.String(), codec.String())
	if err != nil {
		t.Fatal(err)
	}
	long := "é" + strings.Repeat("why? ", 20<<10) // 100 KiB and a bit, not ASCII at the start
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	g := badThenNext(ctx, t, b, topic, fmt.Errorf("%s: %w", long, pubsub.ErrPermanent))
	dl := g.DeadLetters()
	if len(dl) != 1 || !strings.HasPrefix(dl[0].Err.Error(), long) || dl[0].Truncated {
		t.Fatalf("this broker's dead letters: %d, want one with the whole error, not truncated", len(dl))
	}
	raw := rawGroup(t, testServer, opts, "orders", 1, "g")
	latest, err := raw.LatestDeadLetters(ctx, 1)
	if err != nil || len(latest) != 1 {
		t.Fatalf("LatestDeadLetters from another engine: %d, %v", len(latest), err)
	}
	text := latest[0].Err.Error()
	if len(text) > MaxErrorText || !strings.HasPrefix(text, "é") || !strings.HasSuffix(text, "bytes cut]") ||
		!errors.Is(latest[0].Err, pubsub.ErrPermanent) {
		t.Errorf("stored error of %d bytes, %q...%q, permanent %v; want at most %d, cut and saying so, still permanent",
			len(text), text[:10], text[len(text)-20:], errors.Is(latest[0].Err, pubsub.ErrPermanent), MaxErrorText)
	}
}

// startServer starts an embedded server with opts on a temp dir of t's,
// shut down at cleanup.
func startServer(t *testing.T, opts server.Options) *Server {
	t.Helper()
	opts.Host, opts.Port, opts.NoLog, opts.NoSigs = "127.0.0.1", server.RANDOM_PORT, true, true
	opts.JetStream, opts.StoreDir = true, t.TempDir()
	srv, err := server.NewServer(&opts)
	if err != nil {
		t.Fatal(err)
	}
	srv.Start()
	if !srv.ReadyForConnections(10 * time.Second) {
		t.Fatal("server not ready")
	}
	t.Cleanup(func() {
		srv.Shutdown()
		srv.WaitForShutdown()
	})
	return &Server{srv: srv}
}

// TestDeadLetterTheServerRefusesIsDroppedAndReported: on a server whose
// max_payload (4 KiB) is under a letter's own headers and cut error text,
// no shape of the letter fits. The store is tried MaxAttempts times, the
// handler not run again; then the letter is dropped: counted in
// DeadLettered and DeadLettersEvicted, reported by OnDeadLetter (Evicted,
// an error that says so and still matches ErrPermanent), and the record
// behind it is delivered.
func TestDeadLetterTheServerRefusesIsDroppedAndReported(t *testing.T) {
	srv := startServer(t, server.Options{MaxPayload: 4 << 10})
	hooks := &letterHooks{}
	b := brokerOn(t, srv.Engine(testOptions()...), pubsub.WithHooks(hooks))
	topic, err := pubsub.NewTopic(b, "orders", codec.String(), codec.String())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	g := badThenNext(ctx, t, b, topic, fmt.Errorf("%s: %w", strings.Repeat("e", 8<<10), pubsub.ErrPermanent))
	if st := g.Stats(); st.DeadLettered != 1 || st.DeadLettersEvicted != 1 || st.Retried != 0 {
		t.Errorf("stats %+v, want 1 dead-lettered and evicted, 0 retried", st)
	}
	if dl := g.DeadLetters(); len(dl) != 0 {
		t.Errorf("%d dead letters stored, want none", len(dl))
	}
	ev := hooks.all()
	if len(ev) != 1 || !ev[0].Evicted || !errors.Is(ev[0].Err, pubsub.ErrPermanent) ||
		!strings.Contains(ev[0].Err.Error(), "could not be stored") {
		t.Fatalf("dead-letter events %+v, want one, evicted, saying the letter could not be stored", ev)
	}
}

// fillDeadLetters stores n letters in g's dead-letter stream, as a worker
// would, offsets from 0, fast: published asynchronously.
func fillDeadLetters(t testing.TB, g *group, n int) {
	t.Helper()
	subj := g.e.names.dlqSubject(g.t.name, g.name)
	for i := range n {
		m := nats.NewMsg(subj)
		m.Data = []byte("v" + strconv.Itoa(i))
		m.Header.Set(hdrID, "id-"+strconv.Itoa(i))
		m.Header.Set(hdrPartition, "0")
		m.Header.Set(hdrOffset, strconv.Itoa(i))
		m.Header.Set(hdrAttempts, "1")
		m.Header.Set(hdrError, "failed "+strconv.Itoa(i))
		m.Header.Set(hdrErrorKind, "failed") // as letters stored before engine.KindExhausted read
		if _, err := g.e.js.PublishMsgAsync(m, natsjs.WithMsgID("fill-"+strconv.Itoa(i))); err != nil {
			t.Fatal(err)
		}
	}
	select {
	case <-g.e.js.PublishAsyncComplete():
	case <-time.After(30 * time.Second):
		t.Fatal("letters not stored in 30s")
	}
}

// offsets are the letters' record offsets, in their order.
func offsets(ls []engine.DeadLetter) []int64 {
	out := make([]int64, len(ls))
	for i, l := range ls {
		out[i] = l.Record.Offset
	}
	return out
}

// TestManyDeadLettersAreReadNewestFirst: with 5,000 letters,
// LatestDeadLetters returns the newest n, newest first (batches from the
// last sequence backwards); DeadLetters all of them, oldest first; with
// letters removed between them (DiscardDeadLetters), still exactly the
// newest n that remain. A read whose ctx has ended says so with an error.
func TestManyDeadLettersAreReadNewestFirst(t *testing.T) {
	const n = 5000
	opts := testOptions()
	b := brokerOn(t, testServer.Engine(opts...))
	topic, err := pubsub.NewTopic(b, "orders", codec.String(), codec.String())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := topic.Subscribe("g", "c1", pubsub.HandlerFunc[string](func(context.Context, pubsub.Message[string]) error { return nil }),
		pubsub.WithDeadLetterLimit(2*n)); err != nil {
		t.Fatal(err)
	}
	g := rawGroup(t, testServer, opts, "orders", 1, "g")
	fillDeadLetters(t, g, n)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()

	latest, err := g.LatestDeadLetters(ctx, 20)
	if err != nil {
		t.Fatal(err)
	}
	want := make([]int64, 20)
	for i := range want {
		want[i] = n - 1 - int64(i)
	}
	if got := offsets(latest); !slices.Equal(got, want) {
		t.Errorf("newest 20: %v, want %v", got, want)
	}
	all := g.DeadLetters()
	if len(all) != n || all[0].Record.Offset != 0 || all[n-1].Record.Offset != n-1 ||
		!slices.IsSortedFunc(all, func(a, b engine.DeadLetter) int { return int(a.Record.Offset - b.Record.Offset) }) {
		t.Errorf("DeadLetters: %d letters, want %d, oldest first", len(all), n)
	}
	if l := latest[0]; l.ID != "id-"+strconv.Itoa(n-1) || string(l.Record.Value) != "v"+strconv.Itoa(n-1) || l.Err.Error() != "failed "+strconv.Itoa(n-1) {
		t.Errorf("the newest letter: %+v", l)
	}

	// Every letter whose offset is a multiple of 3 goes, and then the
	// newest 2,000 hold a third fewer than 2,000 sequences.
	removed, err := g.DiscardDeadLetters(ctx, func(l *engine.DeadLetter) bool { return l.Record.Offset%3 == 0 })
	if err != nil || removed != (n+2)/3 {
		t.Fatalf("DiscardDeadLetters: %d, %v; want %d, nil", removed, err, (n+2)/3)
	}
	latest, err = g.LatestDeadLetters(ctx, 2000)
	if err != nil || len(latest) != 2000 {
		t.Fatalf("newest 2000 after the discard: %d, %v", len(latest), err)
	}
	for i, l := range latest {
		if l.Record.Offset%3 == 0 || i > 0 && l.Record.Offset >= latest[i-1].Record.Offset {
			t.Fatalf("newest 2000 after the discard: offset %d at %d, after %v", l.Record.Offset, i, offsets(latest[max(0, i-2):i]))
		}
	}
	if latest[0].Record.Offset != n-1 || latest[1999].Record.Offset != n-1-2999 {
		t.Errorf("newest 2000 after the discard run from %d to %d, want %d to %d",
			latest[0].Record.Offset, latest[1999].Record.Offset, n-1, n-1-2999)
	}

	done, stop := context.WithCancel(context.Background())
	stop()
	if got, err := g.LatestDeadLetters(done, 10); !errors.Is(err, context.Canceled) || len(got) > 10 {
		t.Errorf("LatestDeadLetters with an ended ctx: %d letters, %v; want an error saying so", len(got), err)
	}
}

// TestDiscardedLettersAreNotEvictions: DiscardDeadLetters removes what
// its match accepts, or everything, and counts them; letters the limit
// pushed out stay counted in DeadLettersEvicted, discarded ones are not,
// whichever engine asks.
func TestDiscardedLettersAreNotEvictions(t *testing.T) {
	opts := testOptions()
	b := brokerOn(t, testServer.Engine(opts...))
	topic, err := pubsub.NewTopic(b, "orders", codec.String(), codec.String())
	if err != nil {
		t.Fatal(err)
	}
	pg, err := topic.Subscribe("g", "c1", pubsub.HandlerFunc[string](func(context.Context, pubsub.Message[string]) error { return nil }),
		pubsub.WithDeadLetterLimit(10))
	if err != nil {
		t.Fatal(err)
	}
	g := rawGroup(t, testServer, opts, "orders", 1, "g")
	fillDeadLetters(t, g, 15)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if st := pg.Stats(); st.DeadLettersEvicted != 5 {
		t.Fatalf("evicted %d of 15 letters with a limit of 10, want 5", st.DeadLettersEvicted)
	}
	n, err := g.DiscardDeadLetters(ctx, func(l *engine.DeadLetter) bool { return l.Record.Offset >= 12 })
	if n != 3 || err != nil {
		t.Fatalf("discard offsets 12-14: %d, %v; want 3, nil", n, err)
	}
	n, err = g.DiscardDeadLetters(ctx, nil)
	if n != 7 || err != nil {
		t.Fatalf("discard the rest: %d, %v; want 7, nil", n, err)
	}
	if dl := pg.DeadLetters(); len(dl) != 0 {
		t.Errorf("%d dead letters after discarding all, want none", len(dl))
	}
	if st, rst := pg.Stats(), g.Stats(); st.DeadLettersEvicted != 5 || rst.DeadLettersEvicted != 5 {
		t.Errorf("evicted after the discards: %d and %d, want 5 for both engines", st.DeadLettersEvicted, rst.DeadLettersEvicted)
	}
	if n, err := g.DiscardDeadLetters(ctx, nil); n != 0 || err != nil {
		t.Errorf("discard with none left: %d, %v", n, err)
	}
}

// TestNoDeadLettersKeepsNone: a group made with WithDeadLetterLimit(0)
// stores no letter; each record given up on is counted in DeadLettered
// and DeadLettersEvicted and raises OnDeadLetter (Evicted), as in memory.
func TestNoDeadLettersKeepsNone(t *testing.T) {
	hooks := &letterHooks{}
	b := brokerOn(t, testServer.Engine(testOptions()...), pubsub.WithHooks(hooks))
	topic, err := pubsub.NewTopic(b, "orders", codec.String(), codec.String())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	g := badThenNext(ctx, t, b, topic, pubsub.ErrPermanent, pubsub.WithDeadLetterLimit(0))
	if st := g.Stats(); st.DeadLettered != 1 || st.DeadLettersEvicted != 1 {
		t.Errorf("stats %+v, want 1 dead-lettered and evicted", st)
	}
	if dl := g.DeadLetters(); len(dl) != 0 {
		t.Errorf("%d dead letters stored, want none", len(dl))
	}
	if ev := hooks.all(); len(ev) != 1 || !ev[0].Evicted || !errors.Is(ev[0].Err, pubsub.ErrPermanent) {
		t.Errorf("dead-letter events %+v, want one, evicted, with the handler's error", ev)
	}
}

// TestLatestDeadLettersAfterClose: a read, as DeadLetters is: after Close
// it answers from the letters Close read.
func TestLatestDeadLettersAfterClose(t *testing.T) {
	opts := testOptions()
	b := brokerOn(t, testServer.Engine(opts...))
	topic, err := pubsub.NewTopic(b, "orders", codec.String(), codec.String())
	if err != nil {
		t.Fatal(err)
	}
	g, err := topic.Subscribe("g", "c1", pubsub.HandlerFunc[string](func(context.Context, pubsub.Message[string]) error { return pubsub.ErrPermanent }))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for _, v := range []string{"a", "b", "c"} {
		if _, err := topic.Publish(ctx, "k", v); err != nil {
			t.Fatal(err)
		}
	}
	if err := b.Drain(ctx); err != nil {
		t.Fatal(err)
	}
	if err := b.Close(ctx); err != nil {
		t.Fatal(err)
	}
	latest, err := g.LatestDeadLetters(ctx, 2)
	if err != nil || len(latest) != 2 || latest[0].Message.Value != "c" || latest[1].Message.Value != "b" {
		t.Errorf("LatestDeadLetters(2) after Close: %d letters, %v; want c then b", len(latest), err)
	}
}
