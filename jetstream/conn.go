package jetstream

// The engine's connection to the server: how its requests are bounded,
// how an error from the server is classified where it leaves the engine
// (outages), and how a read that takes no context (Lag, Committed,
// Stats, Snapshot) asks the server: until it finds it unreachable, then
// serving the last values observed, never made-up ones (a topic's streams
// as topic.go keeps them, a group's consumers as observed.go does).

import (
	"context"
	"errors"
	"fmt"
	"strings"
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
// It is pubsub.ErrOutcomeUnknown (and [engine.ErrOutcomeUnknown]), the same
// value under this package's name: errors.Is matches either.
var ErrOutcomeUnknown = engine.ErrOutcomeUnknown

// conn is the engine's connection, embedded in eng: its methods are the
// engine's. nc and js are set by Open, never changed after; the rest is
// atomics, and the status channels watchConnection and stopWatching own.
type conn struct {
	nc      *nats.Conn // owned; nil when the connection is the caller's
	js      natsjs.JetStream
	timeout time.Duration // the request timeout (WithRequestTimeout)

	// The connection's status, followed by watchConnection: epoch ends
	// when the connection is lost.
	epoch      atomic.Pointer[connEpoch]
	status     chan nats.Status
	statusDone chan struct{}

	// tail bounds, in Unix nanoseconds, the requests Close makes after
	// its workers stopped (what was left, the snapshots), so that Close
	// returns by the time its ctx ends; once it passed, the reads ask the
	// server nothing (mayAsk).
	tail atomic.Int64
}

// ctx returns a context bounded by the request timeout, for calls that
// take none, and by Close's tail once Close has stopped the workers.
func (c *conn) ctx() (context.Context, context.CancelFunc) {
	d := time.Now().Add(c.timeout)
	if tail := c.tail.Load(); tail != 0 && tail < d.UnixNano() {
		d = time.Unix(0, tail)
	}
	return context.WithDeadline(context.Background(), d)
}

// bounded returns ctx, or ctx bounded by the request timeout when it has
// no deadline.
func (c *conn) bounded(ctx context.Context) (context.Context, context.CancelFunc) {
	if _, ok := ctx.Deadline(); ok {
		return ctx, func() {}
	}
	return context.WithTimeout(ctx, c.timeout)
}

// boundedDo runs f with ctx as bounded bounds it.
func (c *conn) boundedDo(ctx context.Context, f func(context.Context) error) error {
	ctx, cancel := c.bounded(ctx)
	defer cancel()
	return f(ctx)
}

// deleting returns the context of a deletion's requests to the server:
// ctx's values without its end, bounded by the request timeout. A
// deletion takes effect whatever ctx does ([engine.Deleter]): ctx bounds
// only the wait for deliveries in flight.
func (c *conn) deleting(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(ctx), c.timeout)
}

// watchConnection makes the engine follow its connection's status: each
// time the connection is lost a new epoch begins (connEpoch), so that a
// request waiting for an answer the lost connection took with it stops
// waiting and is tried again (see topic.send). Open calls it; Close stops
// it.
func (c *conn) watchConnection() {
	c.epoch.Store(newConnEpoch())
	c.status = c.js.Conn().StatusChanged(nats.RECONNECTING, nats.DISCONNECTED, nats.CLOSED)
	c.statusDone = make(chan struct{})
	go func() { // exits when stopWatching removes the listener, which closes the channel
		defer close(c.statusDone)
		for range c.status {
			c.epoch.Swap(newConnEpoch()).cancel()
		}
	}()
}

// stopWatching stops watchConnection's goroutine and waits for it.
func (c *conn) stopWatching() {
	c.js.Conn().RemoveStatusListener(c.status)
	<-c.statusDone
	c.epoch.Load().cancel()
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
func (c *conn) attempt(ctx context.Context) (context.Context, context.CancelFunc) {
	epoch := c.epoch.Load().ctx
	if ctx.Done() == nil { // never cancelled (Background): the epoch bounded by the request timeout
		return context.WithTimeout(epoch, c.timeout)
	}
	actx, cancel := c.bounded(ctx)
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
func (c *conn) lost() <-chan struct{} { return c.epoch.Load().ctx.Done() }

// connected reports whether the engine's connection is up. While it is
// not (reconnecting, or closed), the reads serve what they last observed
// without asking, and publishes wait for it.
func (c *conn) connected() bool { return c.js.Conn().Status() == nats.CONNECTED }

// mayAsk reports whether a read may ask the server now: the connection is
// up, and Close has not given up asking (its tail passed).
func (c *conn) mayAsk() bool {
	if tail := c.tail.Load(); tail != 0 && time.Now().UnixNano() >= tail {
		return false
	}
	return c.connected()
}

// ctxErr is where the error of a call to the server leaves the engine. It
// prefers ctx's error, so that a request cut short by ctx says so, and
// wraps ErrUnavailable when the error says the server could not be
// reached or did not answer in time (see unavailable).
func (c *conn) ctxErr(ctx context.Context, err error) error {
	if err == nil {
		return nil
	}
	down := c.unavailable(ctx, err)
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
func (c *conn) unavailable(ctx context.Context, err error) bool {
	switch {
	case errors.Is(err, engine.ErrUnavailable):
		return true
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, context.Canceled):
		return ctx.Err() == nil || !c.connected()
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

// reading is one read call's view of the server: it asks until a request
// finds the server unreachable (or when it may not ask to begin with),
// and from then on the read serves what was last observed, so that a read
// during an outage costs at most one request timeout, not one per
// partition.
type reading struct {
	c      *conn
	ctx    context.Context
	down   bool // a request found the server unreachable, or the read may not ask
	failed bool // a request found the server unreachable
}

// read starts a read bounded by the request timeout; the caller calls the
// returned cancel.
func (c *conn) read() (*reading, context.CancelFunc) {
	ctx, cancel := c.ctx()
	return &reading{c: c, ctx: ctx, down: !c.mayAsk()}, cancel
}

// ask reports whether the read may ask the server.
func (r *reading) ask() bool { return !r.down }

// got takes a request's error: true when it succeeded; an error saying
// the server is unreachable stops the read asking, and so does the end of
// Close's tail.
func (r *reading) got(err error) bool {
	switch {
	case err == nil:
	case !r.c.mayAsk() && errors.Is(err, context.DeadlineExceeded):
		r.down = true // cut short by Close's tail, not by the server
	case r.c.unavailable(context.Background(), err):
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

// apiPrefix is the subject prefix of js's API requests, for the requests
// the client has no method for.
func apiPrefix(js natsjs.JetStream) string {
	o := js.Options()
	switch {
	case o.Domain != "":
		return "$JS." + o.Domain + ".API."
	case o.APIPrefix != "":
		return strings.TrimSuffix(o.APIPrefix, ".") + "."
	}
	return natsjs.DefaultAPIPrefix
}
