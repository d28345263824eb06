package jetstream

// Outages: how an error from the server is classified where it leaves the
// engine, and what the engine remembers of the server for the reads that
// take no context (Lag, Committed, Stats, Snapshot), so that they serve
// the last values they observed while the server cannot be asked, never
// made-up ones.

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/logbus/logbus/engine"
	"github.com/nats-io/nats.go"
	natsjs "github.com/nats-io/nats.go/jetstream"
)

// ErrOutcomeUnknown is wrapped by the error of a publish whose record was
// sent to the server but whose acknowledgement never came: the record may
// or may not be stored. It happens when the context ends (or, for a
// context without deadline, the request timeout passes) while the engine
// waits for the server's answer, including across a reconnect; the error
// then also wraps the context's error, and ErrUnavailable when the server
// could not be reached. A retry by the caller is a new publish: if the
// first was stored, the record is stored twice. A failed publish whose
// error does not wrap ErrOutcomeUnknown stored nothing.
//
// Within one call the engine resolves the doubt itself: every record
// carries a message ID (Nats-Msg-Id), the same for each attempt the engine
// makes of one publish, so that a resend after a reconnect is stored once
// (the server's duplicate window, two minutes by default) and the call
// returns the offset of the copy the server kept.
//
// It is pubsub.ErrOutcomeUnknown (and engine.ErrOutcomeUnknown), the same
// value under this package's name: errors.Is matches either.
var ErrOutcomeUnknown = engine.ErrOutcomeUnknown

// watchConnection makes the engine follow its connection's status: each
// time the connection is lost a new epoch begins (connEpoch), so that a
// request waiting for an answer the lost connection took with it stops
// waiting and is tried again (see topic.send). Open calls it; Close stops
// it.
func (e *eng) watchConnection() {
	e.epoch.Store(newConnEpoch())
	e.status = e.js.Conn().StatusChanged(nats.RECONNECTING, nats.DISCONNECTED, nats.CLOSED)
	e.statusDone = make(chan struct{})
	go func() { // exits when stopWatching removes the listener, which closes the channel
		defer close(e.statusDone)
		for range e.status {
			e.epoch.Swap(newConnEpoch()).cancel()
		}
	}()
}

// stopWatching stops watchConnection's goroutine and waits for it.
func (e *eng) stopWatching() {
	e.js.Conn().RemoveStatusListener(e.status)
	<-e.statusDone
	e.epoch.Load().cancel()
}

// connEpoch is a context that ends when the connection is lost.
type connEpoch struct {
	ctx    context.Context
	cancel context.CancelFunc
}

func newConnEpoch() *connEpoch {
	ctx, cancel := context.WithCancel(context.Background())
	return &connEpoch{ctx: ctx, cancel: cancel}
}

// attempt returns a context for one attempt of a request: ctx, bounded by
// the request timeout when ctx has no deadline, that also ends when the
// connection is lost (the answer would be lost with it). The caller calls
// the returned func.
func (e *eng) attempt(ctx context.Context) (context.Context, context.CancelFunc) {
	epoch := e.epoch.Load().ctx
	if ctx.Done() == nil { // never cancelled (Background): the epoch bounded by the request timeout
		return context.WithTimeout(epoch, e.cfg.requestTimeout)
	}
	actx, cancel := e.bounded(ctx)
	actx, cancelLost := context.WithCancel(actx)
	stop := context.AfterFunc(epoch, cancelLost)
	return actx, func() {
		stop()
		cancelLost()
		cancel()
	}
}

// lost returns a channel closed once the connection is lost, for a wait
// that needs no context.
func (e *eng) lost() <-chan struct{} { return e.epoch.Load().ctx.Done() }

// connected reports whether the engine's connection is up. While it is
// not (reconnecting, or closed), the reads serve what they last observed
// without asking, and publishes wait for it.
func (e *eng) connected() bool { return e.js.Conn().Status() == nats.CONNECTED }

// mayAsk reports whether a read may ask the server now: the connection is
// up, and Close has not given up asking (its tail passed).
func (e *eng) mayAsk() bool {
	if tail := e.tail.Load(); tail != 0 && time.Now().UnixNano() >= tail {
		return false
	}
	return e.connected()
}

// ctxErr is where the error of a call to the server leaves the engine. It
// prefers ctx's error, so that a request cut short by ctx says so, and
// wraps ErrUnavailable when the error says the server could not be
// reached or did not answer in time (see unavailable).
func (e *eng) ctxErr(ctx context.Context, err error) error {
	if err == nil {
		return nil
	}
	down := e.unavailable(ctx, err)
	if ctx.Err() != nil && !errors.Is(err, ctx.Err()) {
		err = fmt.Errorf("%w (%v)", ctx.Err(), err)
	}
	if down && !errors.Is(err, engine.ErrUnavailable) {
		err = fmt.Errorf("%w (%w)", err, engine.ErrUnavailable)
	}
	return err
}

// unavailable classifies err, the error of a call bounded by the caller's
// ctx: true when the server could not be reached (the connection is lost
// or closed, nobody answered the request: no responders, JetStream or the
// stream's leader unavailable, no quorum) or did not answer in time (the
// engine's own request timeout, or the caller's deadline while the
// connection was down). A caller's ctx that ended while the connection was
// up is the caller's business, not an outage.
func (e *eng) unavailable(ctx context.Context, err error) bool {
	switch {
	case errors.Is(err, engine.ErrUnavailable):
		return true
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, context.Canceled):
		return ctx.Err() == nil || !e.connected()
	}
	return unreachable(err)
}

// unreachable reports the errors that mean the server could not serve the
// request, whatever the caller's context.
func unreachable(err error) bool {
	for _, target := range []error{nats.ErrConnectionClosed, nats.ErrConnectionDraining, nats.ErrDisconnected,
		nats.ErrNoServers, nats.ErrNoResponders, nats.ErrTimeout, nats.ErrReconnectBufExceeded,
		natsjs.ErrNoStreamResponse, natsjs.ErrConnectionClosed, natsjs.ErrServerShutdown,
		natsjs.ErrJetStreamNotEnabled, natsjs.ErrAsyncPublishTimeout} {
		if errors.Is(err, target) {
			return true
		}
	}
	var apiErr *natsjs.APIError
	if errors.As(err, &apiErr) {
		switch apiErr.ErrorCode {
		case 10008, // JetStream system temporarily unavailable (no meta leader)
			10009,        // the cluster cannot handle the request (not the leader)
			10004,        // incomplete results (peers did not answer)
			10118, 10194, // stream offline
			10119, 10195, // consumer offline
			10163: // expected last sequence per subject temporarily unavailable
			return true
		}
	}
	return false
}

// streamSeen is what the engine last read of a partition's stream.
type streamSeen struct {
	first, last, msgs, bytes uint64
	at                       time.Time
}

// consumerSeen is what the engine last read of a group's consumer on one
// partition.
type consumerSeen struct {
	ackFloor, delivered uint64
	ackPending          int
	paused              bool
	at                  time.Time
}

// observeStream records info as partition p's last observed state.
func (t *topic) observeStream(p int, info *natsjs.StreamInfo) {
	if info == nil {
		return
	}
	st := info.State
	t.seen[p].Store(&streamSeen{first: st.FirstSeq, last: st.LastSeq, msgs: st.Msgs, bytes: st.Bytes, at: time.Now()})
}

// streamInfo reads partition p's stream from the server, and records it.
func (t *topic) streamInfo(ctx context.Context, p int) (*natsjs.StreamInfo, error) {
	info, err := t.streams[p].Info(ctx)
	if err == nil {
		t.observeStream(p, info)
	}
	return info, err
}

// stream returns partition p's stream as last observed (CreateTopic
// observed it first), its end raised to the last record this broker
// stored since.
func (t *topic) stream(p int) *streamSeen {
	s := t.seen[p].Load()
	if s == nil {
		s = &streamSeen{}
	}
	if last := t.counts[p].stored.Load(); last > s.last {
		c := *s
		c.last = last
		s = &c
	}
	return s
}

// observeConsumer records info as the group's last observed consumer on
// partition p.
func (g *group) observeConsumer(p int, info *natsjs.ConsumerInfo) {
	if info == nil {
		return
	}
	g.seen[p].Store(&consumerSeen{ackFloor: info.AckFloor.Stream, delivered: info.Delivered.Stream,
		ackPending: info.NumAckPending, paused: info.Paused, at: time.Now()})
}

// consumerInfo reads the group's consumer on partition p from the server,
// and records it; a consumer that is gone makes the group vanish
// (serverErr).
func (g *group) consumerInfo(ctx context.Context, p int) (*natsjs.ConsumerInfo, error) {
	info, err := g.consumers[p].Info(ctx)
	switch {
	case err == nil:
		g.observeConsumer(p, info)
	case errors.Is(err, natsjs.ErrConsumerNotFound), errors.Is(err, natsjs.ErrStreamNotFound):
		err = g.serverErr(ctx, err) // deleted by another broker
	}
	return info, err
}

// consumer returns the group's consumer on partition p as last observed.
func (g *group) consumer(p int) *consumerSeen {
	if c := g.seen[p].Load(); c != nil {
		return c
	}
	return &consumerSeen{}
}

// lagOf is a partition's lag from what was last observed of its stream
// and the group's consumer: from the stream's last sequence down to the
// ack floor, or to the oldest record retained when retention removed the
// ones between.
func lagOf(s *streamSeen, c *consumerSeen) int64 {
	from := max(c.ackFloor, s.first-min(s.first, 1))
	if s.last > from {
		return int64(s.last - from)
	}
	return 0
}

// settled reports whether, as last observed, the consumer had settled
// every record of the stream (see settledTo).
func (c *consumerSeen) settled(s *streamSeen) bool {
	return c.ackFloor >= s.last || c.delivered >= s.last && c.ackPending == 0
}

// reading is one read call's view of the server: it asks until a request
// finds the server unreachable (or when it may not ask to begin with),
// and from then on the read serves what was last observed, so that a read
// during an outage costs at most one request timeout, not one per
// partition.
type reading struct {
	e      *eng
	ctx    context.Context
	down   bool // a request found the server unreachable, or the read may not ask
	failed bool // a request found the server unreachable
}

// read starts a read bounded by the request timeout; the caller calls the
// returned cancel.
func (e *eng) read() (*reading, context.CancelFunc) {
	ctx, cancel := e.ctx()
	return &reading{e: e, ctx: ctx, down: !e.mayAsk()}, cancel
}

// ask reports whether the read may ask the server.
func (r *reading) ask() bool { return !r.down }

// got takes a request's error: true when it succeeded; an error saying
// the server is unreachable stops the read asking, and so does the end of
// Close's tail.
func (r *reading) got(err error) bool {
	switch {
	case err == nil:
	case !r.e.mayAsk() && errors.Is(err, context.DeadlineExceeded):
		r.down = true // cut short by Close's tail, not by the server
	case r.e.unavailable(context.Background(), err):
		r.down, r.failed = true, true
	}
	return err == nil
}

// observedAt is a zero-safe minimum of observation times.
func observedAt(a, b time.Time) time.Time {
	if a.IsZero() || (!b.IsZero() && b.Before(a)) {
		return b
	}
	return a
}

// seenInt64 is a counter last read from the server, with when.
type seenInt64 struct {
	v  atomic.Int64
	at atomic.Int64 // Unix nanoseconds; 0 until first read
}

func (s *seenInt64) store(v int64) {
	s.v.Store(v)
	s.at.Store(time.Now().UnixNano())
}

func (s *seenInt64) when() time.Time {
	if ns := s.at.Load(); ns != 0 {
		return time.Unix(0, ns)
	}
	return time.Time{}
}
