package jetstream

// Asynchronous publishing ([engine.AsyncAppender]): each partition is a
// pipe that keeps many records in flight on the broker's connection and
// reports their outcomes in order.
//
// In steady state a record is sent at once, with a reply subject of its
// own under one subscription of the engine's (reply.go's handler), and
// needs no goroutine: the server stores the records of a connection in the
// order it receives them, its answers resolve them, and the front of the
// pipe is resolved as far as it has answers. Records are sent without
// conditions, so that several publishers of a partition (other brokers)
// cost nothing.
//
// When the front record fails (an answer that says not stored, no answer
// within the request timeout, a send refused while the connection is
// down), the pipe recovers, on a goroutine of its own, with nothing new
// sent meanwhile (records appended wait in held):
//
//  1. It waits until every record sent has an answer, or has waited the
//     request timeout.
//  2. It asks the server about each record whose outcome it does not know,
//     once the connection is up: the record is sent again, under its
//     message ID, expecting a last message ID that no record has. The
//     server answers a record it stored with its sequence (the duplicate
//     window holds message IDs for two minutes), and refuses any other
//     without storing it. The question goes on the same connection as the
//     record, after it, so a record still on its way is stored (or not)
//     before the question is answered.
//  3. The records before the first one not stored are resolved stored. If
//     a record after it was stored, the server refused a record and then
//     stored a later one (a record too large for MaxBytes while a later
//     one fit; room made between the two by MaxAge or another broker's
//     purge; a stream that lost its leader in a cluster): that gap is
//     reported as it is, each record with its own outcome, and the records
//     after the failed one that were not stored fail with ErrAborted.
//     Otherwise the first record not stored is sent again as a Publish
//     would be (waiting for room under Block, through an outage, bounded
//     by the request timeout and BlockTimeout): stored, the pipe sends the
//     rest again and goes on; given up, it fails with its cause and every
//     record behind it with ErrAborted (or ErrOutcomeUnknown when the
//     server could never be asked about one that was sent).
//
// So a record is never stored twice (a resend is the same message ID), a
// retry never stores a record after a later one, and a gap remains only
// where the server itself refused a record and stored a later one. That
// is why the engine does not declare [engine.GaplessAsync].

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/logbus/logbus/engine"
	"github.com/nats-io/nats.go"
	natsjs "github.com/nats-io/nats.go/jetstream"
)

var _ engine.AsyncAppender = (*topic)(nil)

// outgoing is a record in a pipe.
type outgoing struct {
	msg  *nats.Msg
	done func(int64, error)
	n    uint64 // its number in the pipe's reply subjects, given when it is sent
	sent time.Time

	answered bool
	seq      uint64 // stored at this sequence, when answered without err
	err      error  // the server's answer, or why it was not sent
}

// pipeline is one partition's records in flight (a pipe, below).
type pipeline struct {
	t  *topic
	p  int
	id string // the pipe's token in reply subjects: its number in the engine, base 36, and "-"

	mu         sync.Mutex
	sent       []*outgoing // sent and not resolved, in order: sent[i].n == sent[0].n + i
	held       []*outgoing // appended while the pipe recovers: not sent yet
	recovering bool        // a recovery goroutine owns the records it took from sent, and held
	stopped    bool        // Close stopped the pipe: AppendAsync refuses
	next       uint64      // the number of the next record sent
	timed      bool        // the overdue timer is armed
	answers    chan struct{}
	// ready are resolved records waiting for their done, in order, and
	// resolving is set while a goroutine calls them: see flush.
	ready, spare []*outgoing
	resolving    bool
}

// newPipes makes the pipes of a topic's partitions, registered with the
// engine so that replies find them and Close stops them.
func (e *eng) newPipes(t *topic) []*pipeline {
	e.pipesMu.Lock()
	defer e.pipesMu.Unlock()
	all := append([]*pipeline(nil), e.allPipes()...)
	ps := make([]*pipeline, t.parts)
	for i := range ps {
		ps[i] = &pipeline{t: t, p: i, id: strconv.FormatInt(int64(len(all)), 36) + "-", answers: make(chan struct{}, 1)}
		all = append(all, ps[i])
	}
	e.pipes.Store(&all)
	return ps
}

// allPipes returns every pipe, by number.
func (e *eng) allPipes() []*pipeline {
	if ps := e.pipes.Load(); ps != nil {
		return *ps
	}
	return nil
}

// AppendAsync sends rec to partition p's stream at once, or holds it
// while the partition recovers from a failure (see the top of this file),
// and reports its outcome to done, in order, from the goroutine that
// reads the server's answers (or the pipe's recovery). Every record
// resolves within three request timeouts ([WithRequestTimeout]) of being
// sent: one waiting for its answer, one asking the server about the
// records whose answers did not come, one sending the first record not
// stored again (plus BlockTimeout when its partition is full under
// Block). Close resolves those left. It refuses a
// record (done is not called) after Close began, on a deleted topic, and
// one the server would refuse for its size.
func (t *topic) AppendAsync(_ context.Context, p int, rec *engine.Record, done func(int64, error)) error {
	if err := t.e.refuse("publish"); err != nil {
		return err
	}
	if err := t.refuseDeleted(); err != nil {
		return err
	}
	if p < 0 || p >= t.parts {
		return fmt.Errorf("%w: topic %q has no partition %d", engine.ErrInvalid, t.name, p)
	}
	if err := t.e.replies(); err != nil {
		return t.e.ctxErr(context.Background(), fmt.Errorf("partition %d: not stored: %w", p, err))
	}
	m, err := t.message(p, rec)
	if err != nil {
		return err
	}
	o := &outgoing{msg: m, done: done}
	pp := t.pipes[p]
	pp.mu.Lock()
	if pp.stopped {
		pp.mu.Unlock()
		return fmt.Errorf("publish: %w", engine.ErrClosed)
	}
	if pp.recovering {
		pp.held = append(pp.held, o)
		pp.mu.Unlock()
		return nil
	}
	pp.sendLocked(o)
	pp.advanceLocked() // moves nothing to ready (answers move theirs), but starts a recovery if o was not sent
	pp.mu.Unlock()
	return nil // no flush here: done is never called from AppendAsync, where the caller holds its locks
}

// errNotSent is the answer of a record the pipe could not send: the
// connection was down, or the client refused it.
var errNotSent = errors.New("not sent")

// sendLocked sends o, numbering it. mu is held, so that records go on the
// connection in the pipe's order: the connection's write of a small
// message, into its buffer.
func (pp *pipeline) sendLocked(o *outgoing) {
	e := pp.t.e
	o.n, pp.next = pp.next, pp.next+1
	o.msg.Reply = e.replyPrefix + pp.id + strconv.FormatUint(o.n, 36)
	o.sent, o.answered, o.err = time.Now(), false, nil
	pp.sent = append(pp.sent, o)
	// Not while the connection is down: the client would keep the record
	// for the reconnect and send it then, whatever the pipe decided
	// meanwhile.
	if !e.connected() {
		o.answered, o.err = true, fmt.Errorf("%w: %w", errNotSent, nats.ErrDisconnected)
	} else if err := e.js.Conn().PublishMsg(o.msg); err != nil {
		o.answered, o.err = true, fmt.Errorf("%w: %w", errNotSent, err)
	}
	if !pp.timed {
		pp.timed = true
		time.AfterFunc(e.cfg.requestTimeout, pp.overdue)
	}
}

// advanceLocked moves the records answered stored from the front of the
// pipe to ready, and starts a recovery when the front failed. mu is held;
// the caller calls flush after unlocking.
func (pp *pipeline) advanceLocked() {
	if pp.recovering {
		return
	}
	i := 0
	for ; i < len(pp.sent) && pp.sent[i].answered; i++ {
		if pp.sent[i].err != nil {
			pp.startRecovery()
			break
		}
	}
	if pp.recovering {
		return // the failed record and the ones behind it are the recovery's
	}
	pp.ready = append(pp.ready, pp.sent[:i]...)
	clear(pp.sent[:i])
	pp.sent = pp.sent[i:]
	if len(pp.sent) == 0 {
		pp.sent = pp.sent[:0:0] // let the array go, rather than creep along it
	}
}

// startRecovery starts the pipe's recovery goroutine. mu is held.
func (pp *pipeline) startRecovery() {
	pp.recovering = true
	e := pp.t.e
	e.recoveries.Add(1)
	go func() { // exits when the records it took are resolved: within about two request timeouts, at once after Close
		defer e.recoveries.Done()
		pp.recover()
	}()
}

// answer records the server's answer to the record numbered n.
func (pp *pipeline) answer(n, seq uint64, err error) {
	pp.mu.Lock()
	if len(pp.sent) == 0 || n < pp.sent[0].n || n-pp.sent[0].n >= uint64(len(pp.sent)) {
		pp.mu.Unlock()
		return // resolved already (a late answer, after a recovery gave up waiting for it)
	}
	o := pp.sent[n-pp.sent[0].n]
	if o.answered {
		pp.mu.Unlock()
		return
	}
	o.answered, o.seq, o.err = true, seq, err
	if pp.recovering {
		select {
		case pp.answers <- struct{}{}:
		default:
		}
	}
	pp.advanceLocked()
	pp.mu.Unlock()
	if err == nil {
		pp.t.sawStored(pp.p, seq)
	}
	pp.flush()
}

// overdue runs when the oldest record in flight may have waited the
// request timeout for its answer: then it recovers; otherwise the timer
// is armed again for the oldest.
func (pp *pipeline) overdue() {
	timeout := pp.t.e.cfg.requestTimeout
	pp.mu.Lock()
	defer pp.mu.Unlock()
	pp.timed = false
	if pp.recovering || pp.stopped || len(pp.sent) == 0 {
		return // a recovery waits for answers itself; the next send arms the timer
	}
	if left := timeout - time.Since(pp.sent[0].sent); left > 0 {
		pp.timed = true
		time.AfterFunc(left, pp.overdue)
		return
	}
	pp.startRecovery()
}

// flush calls the done of the records in ready, in order, outside mu.
// Whoever finds nobody resolving does it, until ready is empty: so the
// records of a pipe are resolved one at a time, in order, whichever
// goroutines resolved them.
func (pp *pipeline) flush() {
	pp.mu.Lock()
	if pp.resolving || len(pp.ready) == 0 {
		pp.mu.Unlock()
		return
	}
	pp.resolving = true
	for len(pp.ready) > 0 {
		batch := pp.ready
		pp.ready, pp.spare = pp.spare[:0], nil
		pp.mu.Unlock()
		for _, o := range batch {
			if o.err != nil {
				o.done(-1, o.err)
			} else {
				o.done(int64(o.seq)-1, nil)
			}
		}
		clear(batch)
		pp.mu.Lock()
		pp.spare = batch[:0]
	}
	pp.resolving = false
	pp.mu.Unlock()
}

// outcome is what the recovery knows of a record it took.
type outcome int

const (
	unknown outcome = iota
	stored
	notStored
)

// recover is the pipe's recovery (see the top of this file).
func (pp *pipeline) recover() {
	t, e := pp.t, pp.t.e
	list := pp.awaitAnswers()
	known := make([]outcome, len(list))
	for i, o := range list {
		switch {
		case !o.answered:
			known[i] = unknown
		case o.err == nil:
			known[i] = stored
		default:
			known[i] = notStored
		}
	}
	try := tries{sent: true}
	ctx := e.stopCtx
	for i, o := range list {
		if known[i] != unknown || e.refuse("") != nil {
			continue
		}
		for {
			if err := e.awaitConnection(ctx, &try); err != nil {
				o.err = err
				break
			}
			seq, ok, err := t.probe(ctx, pp.p, o.msg)
			if err == nil {
				o.err = nil
				if ok {
					known[i], o.seq = stored, seq
					t.sawStored(pp.p, seq)
				} else {
					known[i] = notStored
				}
				break
			}
			o.err = err
			if !try.more(ctx, e) || !sleepCtx(ctx, e.closing, 5*time.Millisecond) {
				break
			}
		}
	}
	first := 0
	for first < len(list) && known[first] == stored {
		list[first].err = nil
		first++
	}
	gap, doubt := false, false
	for _, k := range known[min(first+1, len(known)):] {
		gap = gap || k == stored
		doubt = doubt || k == unknown
	}
	if first < len(list) && known[first] == notStored && !gap && !doubt {
		// The first record not stored, and nothing after it stored: send it
		// again, as a Publish would.
		o := list[first]
		o.msg.Reply = ""
		off, err := t.publish(ctx, pp.p, o.msg)
		if err == nil {
			o.err, o.seq = nil, uint64(off)+1
			first++
			pp.finish(list[:first], list[first:], nil)
			return
		}
		list[first].err = err
	} else if first < len(list) && gap {
		list[first].err = pp.failure(list[first], known[first])
	} else if first < len(list) {
		// The server could not be asked about it (it may be stored), or
		// about records after it (they may be stored: sending it again
		// might store it after them).
		try := tries{sent: known[first] == unknown}
		list[first].err = try.failed(t, context.Background(), pp.p, cmpErr(list[first].err, errors.New("no answer")))
	}
	if first == len(list) {
		pp.finish(list, nil, nil)
		return
	}
	// Given up: the first record not stored fails with its cause; the
	// ones behind it with theirs.
	cause := list[first].err
	for i := first + 1; i < len(list); i++ {
		o := list[i]
		switch known[i] {
		case stored:
			o.err = nil
		case unknown:
			o.err = fmt.Errorf("partition %d: %w: behind a record that failed: %w", pp.p, engine.ErrOutcomeUnknown, cause)
		default:
			o.err = aborted(pp.p, cause)
		}
	}
	pp.finish(list, nil, cause)
}

// failure is the error of a record the recovery gives up on without
// sending it again, because a record after it was stored.
func (pp *pipeline) failure(o *outgoing, k outcome) error {
	try := tries{sent: k == unknown}
	cause := o.err
	if cause == nil {
		cause = errors.New("no answer")
	}
	err := try.failed(pp.t, context.Background(), pp.p, cause)
	return fmt.Errorf("%w (a record after it was stored: not sent again, so as not to reorder the partition)", err)
}

// aborted is the error of a record not stored because the one ahead of it
// in partition p failed with cause. It wraps ErrAborted and cause, except
// when cause's outcome is unknown: the aborted record was not stored, and
// its error must not say it may have been (it wraps what else cause does:
// ErrUnavailable, ErrClosed, ctx's error).
func aborted(p int, cause error) error {
	if !errors.Is(cause, engine.ErrOutcomeUnknown) {
		return fmt.Errorf("partition %d: %w: %w", p, engine.ErrAborted, cause)
	}
	a := &abortedError{p: p, cause: cause}
	for _, s := range []error{engine.ErrUnavailable, engine.ErrClosed, engine.ErrTopicNotFound, context.Canceled, context.DeadlineExceeded} {
		if errors.Is(cause, s) {
			a.also = append(a.also, s)
		}
	}
	return a
}

// abortedError is aborted's error behind a record whose outcome is unknown.
type abortedError struct {
	p     int
	cause error
	also  []error
}

func (a *abortedError) Error() string {
	return fmt.Sprintf("partition %d: %v: %v", a.p, engine.ErrAborted, a.cause)
}

func (a *abortedError) Unwrap() []error { return append([]error{engine.ErrAborted}, a.also...) }

// awaitAnswers waits until every record sent has its answer or has waited
// the request timeout (not past Close), then takes them out of the pipe.
func (pp *pipeline) awaitAnswers() []*outgoing {
	e := pp.t.e
	for {
		pp.mu.Lock()
		var wait time.Duration
		for _, o := range pp.sent {
			if !o.answered {
				wait = max(wait, e.cfg.requestTimeout-time.Since(o.sent))
			}
		}
		if wait <= 0 || e.refuse("") != nil {
			list := pp.sent
			pp.sent = nil
			pp.mu.Unlock()
			return list
		}
		pp.mu.Unlock()
		tm := time.NewTimer(wait)
		select {
		case <-pp.answers:
		case <-tm.C:
		case <-e.closing:
		}
		tm.Stop()
	}
}

// finish ends a recovery: done are resolved (stored, or failed with their
// errors), again are sent again, then held; when cause is not nil, held
// fails instead, with ErrAborted (or ErrClosed once Close began). The
// records appended from now on are sent afresh.
func (pp *pipeline) finish(done, again []*outgoing, cause error) {
	e := pp.t.e
	pp.mu.Lock()
	pp.ready = append(pp.ready, done...)
	held := pp.held
	pp.held = nil
	closing := e.refuse("") != nil
	rest := append(again[:len(again):len(again)], held...)
	for _, o := range rest {
		switch {
		case closing:
			o.answered, o.err = true, fmt.Errorf("partition %d: not stored: %w", pp.p, engine.ErrClosed)
			pp.ready = append(pp.ready, o)
		case cause != nil:
			o.answered, o.err = true, aborted(pp.p, cause)
			pp.ready = append(pp.ready, o)
		}
	}
	pp.recovering = false
	if !closing && cause == nil {
		for _, o := range rest {
			pp.sendLocked(o)
		}
		pp.advanceLocked()
	}
	pp.mu.Unlock()
	pp.flush()
}

// probeID is the last message ID a probe expects: no record has it.
const probeID = "logbus: no record has this ID"

// probe asks the server whether m, a record of partition p sent before,
// was stored: it sends m again under its message ID, expecting a last
// message ID no record has, so that the server answers a stored record as
// a duplicate, with its sequence, and refuses one it did not store,
// storing nothing. A failed request is err.
func (t *topic) probe(ctx context.Context, p int, m *nats.Msg) (seq uint64, ok bool, err error) {
	q := nats.NewMsg(m.Subject)
	q.Data = m.Data
	for k, v := range m.Header {
		q.Header[k] = v
	}
	q.Header.Set(natsjs.ExpectedLastMsgIDHeader, probeID)
	actx, cancel := t.e.attempt(ctx)
	ack, err := t.e.js.PublishMsg(actx, q, noRetry)
	cancel()
	switch {
	case err == nil && ack.Duplicate:
		return ack.Sequence, true, nil
	case err == nil: // cannot be: no stream's last message has probeID
		return ack.Sequence, true, nil
	case isWrongSequence(err):
		return 0, false, nil
	}
	return 0, false, err
}

// replies makes the engine's reply subscription on first use.
func (e *eng) replies() error {
	e.replyMu.Lock()
	defer e.replyMu.Unlock()
	if e.replySub != nil {
		return nil
	}
	prefix := e.js.Conn().NewInbox() + "."
	sub, err := e.js.Conn().Subscribe(prefix+"*", e.onReply)
	if err != nil {
		return err
	}
	// The pipes' answers are read as fast as they come: a limit would
	// drop some, and their records would wait the request timeout.
	_ = sub.SetPendingLimits(-1, -1)
	e.replyPrefix, e.replySub = prefix, sub
	return nil
}

// pubAck is the server's answer to a publish.
type pubAck struct {
	Seq   uint64           `json:"seq"`
	Error *natsjs.APIError `json:"error"`
}

// onReply reads an answer of the server to a record of a pipe: it runs on
// the subscription's goroutine, one answer at a time.
func (e *eng) onReply(m *nats.Msg) {
	token := m.Subject[len(e.replyPrefix):]
	id, n, ok := strings.Cut(token, "-")
	if !ok {
		return
	}
	i, err1 := strconv.ParseUint(id, 36, 64)
	num, err2 := strconv.ParseUint(n, 36, 64)
	pipes := e.allPipes()
	if err1 != nil || err2 != nil || i >= uint64(len(pipes)) {
		return
	}
	pp := pipes[i]
	if len(m.Data) == 0 && m.Header.Get("Status") == "503" {
		pp.answer(num, 0, nats.ErrNoResponders)
		return
	}
	if seq, ok := ackSeq(m.Data); ok {
		pp.answer(num, seq, nil)
		return
	}
	var ack pubAck
	if err := json.Unmarshal(m.Data, &ack); err != nil {
		pp.answer(num, 0, fmt.Errorf("%w: %w", natsjs.ErrInvalidJSAck, err))
		return
	}
	if ack.Error != nil {
		pp.answer(num, 0, ack.Error)
		return
	}
	pp.answer(num, ack.Seq, nil)
}

// ackSeq reads the sequence of a PubAck the way the server writes one
// that stored a record, {"stream":"<name>","seq":<n>...}, without the
// JSON decoder, which was a tenth of the pipe's own work per record. Any
// other answer (an error, another form) is not ok, for the decoder.
func ackSeq(data []byte) (uint64, bool) {
	const stream, seq = `{"stream":"`, `","seq":`
	if !bytes.HasPrefix(data, []byte(stream)) {
		return 0, false
	}
	rest := data[len(stream):]
	i := bytes.IndexByte(rest, '"')
	if i < 0 || !bytes.HasPrefix(rest[i:], []byte(seq)) {
		return 0, false
	}
	rest = rest[i+len(seq):]
	var n uint64
	digits := 0
	for _, c := range rest {
		if c < '0' || c > '9' {
			break
		}
		n = n*10 + uint64(c-'0')
		digits++
	}
	if digits == 0 || digits > 19 || (digits < len(rest) && rest[digits] != ',' && rest[digits] != '}') {
		return 0, false
	}
	return n, n > 0
}

// stopPipes resolves what the pipes still hold, for Close, once the typed
// layer stopped waiting for them: a record sent and not answered fails
// with [ErrOutcomeUnknown], one not sent with ErrClosed. A pipe that
// recovers resolves its records itself (Close began: it stops at once);
// stopPipes waits for it.
func (e *eng) stopPipes() {
	e.stopCancel()
	for _, pp := range e.allPipes() {
		pp.mu.Lock()
		pp.stopped = true
		if !pp.recovering {
			for _, o := range pp.sent {
				if !o.answered {
					o.answered, o.err = true, fmt.Errorf("partition %d: %w: %w", pp.p, engine.ErrOutcomeUnknown, engine.ErrClosed)
				}
			}
			pp.ready = append(pp.ready, pp.sent...)
			pp.sent = nil
		}
		pp.mu.Unlock()
		pp.flush()
	}
	e.recoveries.Wait()
	e.replyMu.Lock()
	if e.replySub != nil {
		_ = e.replySub.Unsubscribe()
	}
	e.replyMu.Unlock()
}
