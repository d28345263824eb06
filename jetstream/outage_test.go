package jetstream

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/logbus/logbus/codec"
	"github.com/logbus/logbus/engine"
	"github.com/logbus/logbus/pubsub"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	natsjs "github.com/nats-io/nats.go/jetstream"
)

// restartable is an embedded server on a fixed loopback port and store
// directory, so that it can be stopped and started again while clients
// reconnect to it (Server listens on a random port, and Server.Connect's
// in-process connections cannot reconnect to a new server).
type restartable struct {
	t    testing.TB
	port int
	dir  string
	srv  *server.Server
}

func newRestartable(t testing.TB) *restartable {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	r := &restartable{t: t, port: port, dir: t.TempDir()}
	r.start()
	t.Cleanup(r.stop)
	return r
}

func (r *restartable) url() string { return fmt.Sprintf("nats://127.0.0.1:%d", r.port) }

// start starts the server on its port and directory.
func (r *restartable) start() {
	r.t.Helper()
	srv, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: r.port, NoLog: true, NoSigs: true,
		JetStream: true, StoreDir: r.dir})
	if err != nil {
		r.t.Fatal(err)
	}
	srv.Start()
	if !srv.ReadyForConnections(10 * time.Second) {
		r.t.Fatal("server not ready after 10s")
	}
	r.srv = srv
}

// stop shuts the server down, if it runs.
func (r *restartable) stop() {
	if r.srv != nil {
		r.srv.Shutdown()
		r.srv.WaitForShutdown()
		r.srv = nil
	}
}

// stopSeen stops the server and returns once nc saw it go (it is
// disconnected, or reconnecting).
func (r *restartable) stopSeen(t testing.TB, nc *nats.Conn) {
	t.Helper()
	seen := nc.StatusChanged(nats.DISCONNECTED, nats.RECONNECTING)
	defer nc.RemoveStatusListener(seen)
	r.stop()
	select {
	case <-seen:
	case <-time.After(10 * time.Second):
		t.Fatal("the client did not see the server stop within 10s")
	}
}

// connect opens a connection that reconnects quickly and forever, closed
// at cleanup (after the brokers registered later are closed).
func (r *restartable) connect(t testing.TB) *nats.Conn {
	t.Helper()
	nc, err := nats.Connect(r.url(), nats.ReconnectWait(20*time.Millisecond), nats.MaxReconnects(-1),
		nats.ReconnectJitter(0, 0))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	return nc
}

// captured opens brokers' engines as its Engine does, and keeps the last
// one, so that a test can call what pubsub does not offer yet.
type captured struct {
	pubsub.Engine
	mu   sync.Mutex
	last *eng
}

func (c *captured) Open(cfg engine.Config) (engine.Engine, error) {
	e, err := c.Engine.Open(cfg)
	if err == nil {
		c.mu.Lock()
		c.last = e.(*eng)
		c.mu.Unlock()
	}
	return e, err
}

// brokerWithEngine returns a broker on e and the engine it opened.
func brokerWithEngine(tb testing.TB, e pubsub.Engine, opts ...pubsub.BrokerOption) (*pubsub.Broker, *eng) {
	tb.Helper()
	c := &captured{Engine: e}
	b := brokerOn(tb, c, opts...)
	c.mu.Lock()
	defer c.mu.Unlock()
	return b, c.last
}

// fileOptions are testOptions on file storage, which survives a restart.
func fileOptions(extra ...Option) []Option {
	return testOptions(append([]Option{WithStorage(FileStorage)}, extra...)...)
}

// waitFor polls cond until it holds, and fails the test if it does not
// within bound; it returns how long it took.
func waitFor(t *testing.T, what string, bound time.Duration, cond func() bool) time.Duration {
	t.Helper()
	start := time.Now()
	if !poll(bound, cond) {
		t.Fatalf("%s: not within %v", what, bound)
	}
	return time.Since(start)
}

// poll calls cond every 20ms until it holds, for at most bound, and
// reports whether it held. It is the barrier for what a real server does
// in its own time and tells no one: a reconnect, an election, a member's
// key expiring, an assignment another broker reads at its next tick.
func poll(bound time.Duration, cond func() bool) bool {
	deadline := time.NewTimer(bound)
	defer deadline.Stop()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		select {
		case <-deadline.C:
			return cond()
		case <-tick.C:
		}
	}
	return true
}

// TestAnOutageIsReportedAndReadsKeepTheirLastValues stops the server
// under a broker: Ping reports ErrUnavailable at once (the connection is
// down), Lag, Committed and Stats keep the values last read instead of 0
// or -1, the Snapshot says it is unavailable and when its values were
// read, a publish fails saying it stored nothing (wrapping
// ErrUnavailable), and a group's control call wraps ErrUnavailable too.
// After a restart on the same directory, Ping answers again and the
// reads are fresh.
func TestAnOutageIsReportedAndReadsKeepTheirLastValues(t *testing.T) {
	srv := newRestartable(t)
	nc := srv.connect(t)
	js, err := Connect(nc, fileOptions()...)
	if err != nil {
		t.Fatal(err)
	}
	b := brokerOn(t, js)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	topic, err := pubsub.NewTopic(b, "orders", codec.String(), codec.String(), pubsub.WithPartitions(2))
	if err != nil {
		t.Fatal(err)
	}
	g, err := topic.Subscribe("billing", "b1", pubsub.HandlerFunc[string](func(context.Context, pubsub.Message[string]) error { return nil }))
	if err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		if _, err := topic.Publish(ctx, fmt.Sprint("k", i), "handled"); err != nil {
			t.Fatal(err)
		}
	}
	if err := b.Drain(ctx); err != nil {
		t.Fatal(err)
	}
	if err := g.Pause(ctx); err != nil { // the lag stays, on the server too
		t.Fatal(err)
	}
	for i := range 7 {
		if _, err := topic.Publish(ctx, fmt.Sprint("k", i), "waiting"); err != nil {
			t.Fatal(err)
		}
	}
	if err := b.Ping(ctx); err != nil {
		t.Fatalf("Ping with the server up: %v", err)
	}
	lag, committed := g.Lag(), []int64{g.Committed(0), g.Committed(1)}
	published := topic.Stats().Published
	if lag != 7 || committed[0]+committed[1] != 3 || published != 10 {
		t.Fatalf("before the outage: lag %d, committed %v, published %d; want 7, 3 in all, 10", lag, committed, published)
	}
	before := b.Snapshot()
	if before.Unavailable {
		t.Errorf("snapshot with the server up says it is unavailable")
	}

	srv.stop()
	stopped := time.Now()
	took := waitFor(t, "Ping reporting ErrUnavailable", 5*time.Second, func() bool {
		return errors.Is(b.Ping(ctx), pubsub.ErrUnavailable)
	})
	t.Logf("Ping reported ErrUnavailable %v after the server stopped", took)
	if err := b.Ping(ctx); !errors.Is(err, pubsub.ErrUnavailable) {
		t.Errorf("Ping while the server is down: %v, want ErrUnavailable", err)
	}
	start := time.Now()
	if got := g.Lag(); got != lag {
		t.Errorf("Lag while the server is down: %d, want the last observed %d", got, lag)
	}
	for p, want := range committed {
		if got := g.Committed(p); got != want {
			t.Errorf("Committed(%d) while the server is down: %d, want the last observed %d", p, got, want)
		}
	}
	if got := topic.Stats().Published; got != published {
		t.Errorf("Published while the server is down: %d, want the last observed %d", got, published)
	}
	s := b.Snapshot()
	if took := time.Since(start); took > time.Second {
		t.Errorf("the reads took %v while the server was down, want them served at once from what was observed", took)
	}
	if !s.Unavailable || len(s.Topics) != 1 || len(s.Topics[0].Groups) != 1 {
		t.Fatalf("snapshot while the server is down: %+v, want Unavailable with the topic and its group", s)
	}
	ts, gs := s.Topics[0], s.Topics[0].Groups[0]
	if gs.Lag != lag || ts.Stats.Published != published || !ts.Observed.Before(stopped) || !gs.Observed.Before(stopped) {
		t.Errorf("snapshot while the server is down: lag %d, published %d, observed %v and %v; want %d, %d, both before the stop at %v",
			gs.Lag, ts.Stats.Published, ts.Observed, gs.Observed, lag, published, stopped)
	}
	pctx, pcancel := context.WithTimeout(ctx, 200*time.Millisecond)
	_, err = topic.Publish(pctx, "k", "during")
	pcancel()
	if !errors.Is(err, pubsub.ErrUnavailable) || errors.Is(err, ErrOutcomeUnknown) || !strings.Contains(err.Error(), "not stored") {
		t.Errorf("Publish while the server is down: %v, want ErrUnavailable saying it was not stored", err)
	}
	sctx, scancel := context.WithTimeout(ctx, 200*time.Millisecond)
	err = g.Seek(sctx, 0, 0)
	scancel()
	if !errors.Is(err, pubsub.ErrUnavailable) {
		t.Errorf("Seek while the server is down: %v, want ErrUnavailable", err)
	}

	srv.start()
	took = waitFor(t, "Ping answering after the restart", 10*time.Second, func() bool { return b.Ping(ctx) == nil })
	t.Logf("Ping answered %v after the restart", took)
	if got := g.Lag(); got != lag {
		t.Errorf("Lag after the restart: %d, want %d", got, lag)
	}
	if _, err := topic.Publish(ctx, "k", "after"); err != nil {
		t.Errorf("Publish after the restart: %v", err)
	}
	if got := topic.Stats().Published; got != published+1 {
		t.Errorf("Published after the restart: %d, want %d (the publish during the outage stored nothing)", got, published+1)
	}
	if s := b.Snapshot(); s.Unavailable || s.Topics[0].Groups[0].Observed.Before(stopped) {
		t.Errorf("snapshot after the restart: unavailable %v, group observed %v; want fresh values", s.Unavailable, s.Topics[0].Groups[0].Observed)
	}
}

// TestAPublishAcrossAServerRestartIsStoredOnce stops the server in the
// middle of a stream of publishes (four publishers, two partitions) and
// starts it again on the same directory, each publisher trying every
// record until it is stored: no record is stored twice unless a failed
// attempt of it said its outcome was unknown, every record is stored, and
// every offset a publish reported holds that record.
func TestAPublishAcrossAServerRestartIsStoredOnce(t *testing.T) {
	srv := newRestartable(t)
	nc := srv.connect(t)
	js, err := Connect(nc, fileOptions()...)
	if err != nil {
		t.Fatal(err)
	}
	b, e := brokerWithEngine(t, js)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	topic, err := pubsub.NewTopic(b, "events", codec.String(), codec.String(), pubsub.WithPartitions(2))
	if err != nil {
		t.Fatal(err)
	}
	const publishers, each = 4, 400
	type outcome struct {
		pos      pubsub.Position
		unknown  int // failed attempts that said the outcome was unknown
		notStore int // failed attempts that said nothing was stored
	}
	var mu sync.Mutex
	outcomes := map[string]*outcome{}
	var slowest time.Duration
	halfway := make(chan struct{})
	var once sync.Once
	// The outage lasts until every publisher with records left is inside
	// a Publish: calling counts them, and moved tells the test when.
	var calling, unfinished atomic.Int32
	unfinished.Store(publishers)
	moved := make(chan struct{}, 1)
	nudge := func() {
		select {
		case moved <- struct{}{}:
		default:
		}
	}
	var wg sync.WaitGroup
	for w := range publishers {
		wg.Go(func() {
			defer func() { unfinished.Add(-1); nudge() }()
			for i := range each {
				v := fmt.Sprintf("p%d-%d", w, i)
				o := &outcome{}
				for {
					pctx, pcancel := context.WithTimeout(ctx, 5*time.Second)
					start := time.Now()
					calling.Add(1)
					nudge()
					pos, err := topic.Publish(pctx, fmt.Sprint("k", i%8), v)
					calling.Add(-1)
					took := time.Since(start)
					pcancel()
					mu.Lock()
					slowest = max(slowest, took)
					mu.Unlock()
					if err == nil {
						o.pos = pos
						break
					}
					if ctx.Err() != nil {
						t.Errorf("publish of %s: %v", v, err)
						return
					}
					if errors.Is(err, ErrOutcomeUnknown) {
						o.unknown++
					} else {
						o.notStore++
					}
					t.Logf("publish of %s failed, trying again: %v", v, err)
				}
				mu.Lock()
				outcomes[v] = o
				if len(outcomes) == publishers*each/3 {
					once.Do(func() { close(halfway) })
				}
				mu.Unlock()
			}
		})
	}
	select {
	case <-halfway:
	case <-ctx.Done():
		t.Fatal("the publishers did not get a third of the way")
	}
	srv.stopSeen(t, nc)
	for calling.Load() < unfinished.Load() { // the outage: every publisher is caught in it
		select {
		case <-moved:
		case <-ctx.Done():
			t.Fatalf("%d of %d publishers inside a Publish during the outage", calling.Load(), unfinished.Load())
		}
	}
	srv.start()
	wg.Wait()

	// What the server stored, read from its streams.
	stored := map[string]int{}
	at := map[pubsub.Position]string{}
	total := 0
	for p, vs := range storedValues(t, nc, e, "events", 2) {
		for off, v := range vs {
			stored[v]++
			total++
			at[pubsub.Position{Partition: p, Offset: int64(off)}] = v
		}
	}
	unknown, notStored := 0, 0
	for v, o := range outcomes {
		unknown += o.unknown
		notStored += o.notStore
		switch n := stored[v]; {
		case n == 0:
			t.Errorf("%s was reported stored at %+v but is not", v, o.pos)
		case n > 1 && o.unknown == 0:
			t.Errorf("%s is stored %d times, though no failed attempt of it said its outcome was unknown", v, n)
		}
		if got := at[o.pos]; got != v {
			t.Errorf("%s was reported stored at %+v, which holds %q", v, o.pos, got)
		}
	}
	if len(outcomes) != publishers*each || len(stored) != publishers*each {
		t.Errorf("%d records published, %d distinct ones stored; want %d", len(outcomes), len(stored), publishers*each)
	}
	t.Logf("%d records, %d stored; failed attempts: %d with the outcome unknown, %d not stored; slowest publish %v",
		len(outcomes), total, unknown, notStored, slowest)
}

// TestTheEnginesRetryOfAPublishIsStoredOnce sends one record's message twice,
// as the engine does after an attempt whose answer was lost: the server
// keeps one copy and both attempts return its offset. A user's publish of
// an equal record is another record.
func TestTheEnginesRetryOfAPublishIsStoredOnce(t *testing.T) {
	b, e := brokerWithEngine(t, testServer.Engine(testOptions()...))
	ctx := t.Context()
	topic, err := pubsub.NewTopic(b, "orders", codec.String(), codec.String())
	if err != nil {
		t.Fatal(err)
	}
	e.mu.Lock()
	et := e.topics["orders"]
	e.mu.Unlock()
	m, err := et.message(0, &engine.Record{Key: []byte("k"), Value: []byte("v")})
	if err != nil {
		t.Fatal(err)
	}
	first, err := et.publish(ctx, 0, m)
	if err != nil {
		t.Fatal(err)
	}
	again, err := et.publish(ctx, 0, m)
	if err != nil || again != first {
		t.Errorf("the same message sent again: offset %d, %v; want %d, the stored copy's", again, err, first)
	}
	p1, err1 := topic.Publish(ctx, "k", "v")
	p2, err2 := topic.Publish(ctx, "k", "v")
	if err1 != nil || err2 != nil || p1.Offset != first+1 || p2.Offset != first+2 {
		t.Errorf("two publishes of an equal record: %+v %v, %+v %v; want offsets %d and %d", p1, err1, p2, err2, first+1, first+2)
	}
	if got := topic.Stats().Published; got != 3 {
		t.Errorf("published %d, want 3: one for the message sent twice, two for the user's publishes", got)
	}
}

// blackhole is a TCP proxy in front of a server that can stop passing the
// server's answers on, as a network that loses them would: the client's
// connection stays up, and what it sends still reaches the server.
type blackhole struct {
	l    net.Listener
	hold chan struct{} // closed: answers are dropped
	wg   sync.WaitGroup
	mu   sync.Mutex
	cs   []net.Conn
}

func newBlackhole(t *testing.T, to string) *blackhole {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	h := &blackhole{l: l, hold: make(chan struct{})}
	h.wg.Go(func() { // exits when close closes the listener
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			s, err := net.Dial("tcp", to)
			if err != nil {
				c.Close()
				continue
			}
			h.mu.Lock()
			h.cs = append(h.cs, c, s)
			h.mu.Unlock()
			h.wg.Go(func() { pipe(s, c, nil) })    // exits when either side closes
			h.wg.Go(func() { pipe(c, s, h.hold) }) // exits when either side closes
		}
	})
	t.Cleanup(h.close)
	return h
}

// pipe copies from src to dst until either fails, dropping what it reads
// once drop is closed.
func pipe(dst, src net.Conn, drop chan struct{}) {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if err != nil {
			dst.Close()
			return
		}
		select {
		case <-drop:
			continue
		default:
		}
		if _, err := dst.Write(buf[:n]); err != nil {
			src.Close()
			return
		}
	}
}

func (h *blackhole) url() string { return "nats://" + h.l.Addr().String() }

func (h *blackhole) close() {
	h.l.Close()
	h.mu.Lock()
	for _, c := range h.cs {
		c.Close()
	}
	h.mu.Unlock()
	h.wg.Wait()
}

// TestAPublishWhoseAnswerIsLostSaysItsOutcomeIsUnknown loses the server's
// answers while a publish waits for its acknowledgement: the publish
// fails when its context ends, saying (ErrOutcomeUnknown) that the record
// may have been stored, and it was, as another connection sees. A "not
// stored" there would have been a lie.
func TestAPublishWhoseAnswerIsLostSaysItsOutcomeIsUnknown(t *testing.T) {
	srv := newRestartable(t)
	h := newBlackhole(t, strings.TrimPrefix(srv.url(), "nats://"))
	nc, err := nats.Connect(h.url(), nats.MaxReconnects(0))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := Connect(nc, testOptions()...)
	if err != nil {
		t.Fatal(err)
	}
	b, e := brokerWithEngine(t, js)
	ctx := t.Context()
	topic, err := pubsub.NewTopic(b, "orders", codec.String(), codec.String())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := topic.Publish(ctx, "k", "answered"); err != nil {
		t.Fatal(err)
	}
	close(h.hold)
	pctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	_, err = topic.Publish(pctx, "k", "unanswered")
	cancel()
	if !errors.Is(err, ErrOutcomeUnknown) || !errors.Is(err, context.DeadlineExceeded) || strings.Contains(err.Error(), "not stored") {
		t.Errorf("Publish whose answer was lost: %v, want ErrOutcomeUnknown and the context's error", err)
	}
	direct := srv.connect(t)
	jsc, err := natsjs.New(direct)
	if err != nil {
		t.Fatal(err)
	}
	s, err := jsc.Stream(ctx, e.names.stream("orders", 0))
	if err != nil {
		t.Fatal(err)
	}
	if got := s.CachedInfo().State.Msgs; got != 2 {
		t.Errorf("the server stored %d records, want 2: the unanswered one was stored", got)
	}
}
