package core

import (
	"bytes"
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/logbus/logbus/engine"
	"github.com/logbus/logbus/internal/kit"
)

// readBatch is how many records a worker takes from its partition per read.
// A worker that wakes takes everything appended since, up to this many, in
// one read without the partition's lock, and delivers them.
const readBatch = 64

// worker is the goroutine that serves one (group, partition) for one
// member: read at the committed offset, deliver, retry with backoff,
// dead-letter, commit. Being the only reader of the partition for its group
// is what orders the partition's records for the group.
//
// Its owner is the group, which starts it and signals it to stop; the
// worker then finishes its current delivery, exits, and tells the group
// (Group.exited), which may start its successor.
type worker struct {
	g  *Group
	gp *groupPartition
	m  *member

	ctx     context.Context // the handlers' context: the broker's, carrying self (see handlerOf)
	self    handlerSlot     // the worker's own handler, for handlerOf
	stop    chan struct{}   // closed by signal: finish the current delivery, then exit
	stopped atomic.Bool     // set by signal before it closes stop: checked per record, for less than a select costs
	bell    chan struct{}   // rung by the partition when records arrive; see Partition.Read
	buf     [readBatch]*Record

	readEnd  int64    // the offset after the last record read
	delivery Delivery // handed to the handler; see call

	// A batch consumer's worker reads into recs instead of buf (see
	// runBatches) and hands over batch. recs and ids grow with what the
	// partition has to deliver, up to limit (see fit).
	recs  []*Record
	ids   []string
	limit int // the most records a batch holds: MaxSize, or fewer when the partition holds fewer
	batch Batch
	one   [1]*Record  // a redriven letter, handed over alone (callOne)
	wait  *time.Timer // MaxWait, made on first use
}

// startWorker starts the worker of gp for m. The caller holds g.mu.
func startWorker(g *Group, gp *groupPartition, m *member) *worker {
	w := &worker{g: g, gp: gp, m: m, stop: make(chan struct{}), bell: make(chan struct{}, 1)}
	w.self = handlerSlot{w: w}
	w.ctx = context.WithValue(g.broker.handlerCtx, handlerKey{}, &w.self)
	w.delivery = Delivery{Topic: g.topic.name, Partition: gp.index, Revoked: w.stop}
	if m.batch != nil {
		w.limit = min(m.spec.MaxSize, gp.part.ring.size())
		w.batch = Batch{Topic: g.topic.name, Partition: gp.index, Revoked: w.stop}
	}
	// The goroutine exits when stop is closed, after its current delivery;
	// sooner, without committing, when the broker's handler context ends
	// while a delivery is in flight.
	go func() {
		defer g.exited(w)
		w.run()
		w.hold()
	}()
	return w
}

// hold keeps the partition until the group takes it back (stop) or Close
// gives up on the handlers. A worker's loop ends early, without stop, only
// when the handler gave a delivery back (ErrNotDelivered, ErrAbandoned):
// its consumer is going away, but the group has not moved the partition
// yet. Exiting then would make exited start a successor for the same
// member at once, which would read the same record and be given it back
// again, as often as the scheduler allows before the member's Leave takes
// the group's lock (a closed Stream gave one unread delivery back hundreds
// of times in one Close, raising the delivery hooks each time). Held, the
// record waits, uncommitted, for the partition's next owner; meanwhile
// the partition shows Pending, not a delivery in flight (which the stuck
// watchdog would report).
func (w *worker) hold() {
	if w.stopping() {
		return
	}
	w.gp.setState(Pending)
	select {
	case <-w.stop:
	case <-w.g.broker.handlerCtx.Done():
	}
}

// handlerKey is the key under which a handler's context carries its
// handlerSlot, so that a publish made with it can tell that it comes from
// the handler of a partition (see Partition.waitsForItselfLocked). The
// value is set once per worker (and per handler goroutine of a group with
// key concurrency), not per delivery: it costs the deliveries nothing.
type handlerKey struct{}

// handlerSlot is one handler of a worker: the worker's own, which runs on
// its goroutine, or one of the handler goroutines of a group with key
// concurrency (keyed set), which says in offset which record it handles.
type handlerSlot struct {
	w      *worker
	keyed  bool
	offset atomic.Int64 // keyed: the offset of the record being handled, -1 between deliveries
}

// handlerOf returns the handler slot that was given ctx (or a context
// derived from it) when its worker serves p, else nil. ctx.Value may be
// user code: call it under no lock.
func handlerOf(ctx context.Context, p *Partition) *handlerSlot {
	if s, _ := ctx.Value(handlerKey{}).(*handlerSlot); s != nil && s.w.gp.part == p {
		return s
	}
	return nil
}

// startHandlers starts the n handler goroutines of a worker whose group
// has key concurrency n: each takes jobs, calls the handler and sends the
// result, until jobs is closed. done is told when each exits.
func (w *worker) startHandlers(n int, jobs <-chan keyJob, results chan<- keyResult, done *sync.WaitGroup) {
	for range n {
		s := &handlerSlot{w: w, keyed: true}
		s.offset.Store(-1)
		ctx := context.WithValue(w.g.broker.handlerCtx, handlerKey{}, s)
		done.Go(func() { w.handle(ctx, s, jobs, results) }) // exits when the worker closes jobs, after its delivery in flight
	}
}

// signal tells the worker to stop. Idempotent; the caller holds g.mu.
func (w *worker) signal() {
	if w.stopped.CompareAndSwap(false, true) {
		close(w.stop)
	}
}

func (w *worker) stopping() bool { return w.stopped.Load() }

func (w *worker) run() {
	switch {
	case w.m.batch != nil:
		w.runBatches()
		return
	case w.gp.keys != nil:
		w.runKeys()
		return
	}
	part, cursor := w.gp.part, w.gp.cursor
	for !w.stopping() {
		if w.gp.redrive.pending.Load() > 0 { // dead letters sent back (Redrive) come first
			if !w.redeliver() {
				return
			}
			continue
		}
		// Read the offset afresh each turn: it is the group's, not ours.
		offset := cursor.Committed()
		n, skipTo, waiting := part.Read(offset, w.buf[:], cursor, w.bell)
		switch {
		case skipTo > offset:
			// Retention trimmed records this group had not read. Skip to the
			// earliest one and count the gap: visible loss, never silent.
			_ = w.skip(offset, skipTo)
			continue
		case waiting:
			select {
			case <-w.bell:
			case <-w.stop:
				return
			}
			continue
		}
		w.readEnd = offset + int64(n)
		if !w.deliverBatch(w.buf[:n]) {
			return
		}
	}
}

// skip moves the cursor from offset past the records retention trimmed
// before the group read them, up to skipTo, and counts and reports them:
// visible loss, never silent. It reports false when Close sealed the
// cursor first.
func (w *worker) skip(offset, skipTo int64) bool {
	if !w.gp.cursor.Commit(offset, skipTo) {
		return false
	}
	w.g.skipped.Add(skipTo - offset)
	w.committed(skipTo)
	w.observeSkip(offset, skipTo)
	return true
}

// observeSkip reports the records from offset to skipTo, trimmed before
// the group read them.
func (w *worker) observeSkip(offset, skipTo int64) {
	if obs := w.g.broker.obs; obs != nil {
		obs.Observe(&Event{Kind: engine.EventSkip, Topic: w.g.topic.name, Group: w.g.name,
			Partition: w.gp.index, Offset: offset, To: skipTo})
	}
}

// deliverBatch delivers recs in offset order, committing each after its
// outcome. It reports false when the worker must exit.
func (w *worker) deliverBatch(recs []*Record) bool {
	defer clear(recs) // drop the references so trimmed records can be freed
	gp, cursor := w.gp, w.gp.cursor
	defer gp.showAck() // an early return leaves no ack unshown
	for i, rec := range recs {
		out := w.deliver(rec)
		switch out {
		case interrupted:
			return false // no commit: the record is delivered again later
		case evicted:
			return true // the next read finds the cursor trimmed, skips and counts
		case acked:
			// The last record's ack is shown before its commit, which may
			// wake Drain; the others go out with the next InFlight.
			gp.ack(i < len(recs)-1)
		}
		// Once committed, rec may be reused for another record: see Record.
		next := rec.Offset + 1
		if !cursor.Commit(next-1, next) {
			// Close sealed the cursor while the handler ran: the record is
			// not delivered, so its ack does not count either. (A seek
			// cannot move the cursor under a running worker.)
			if out == acked {
				gp.unack()
			}
			return false
		}
		w.committed(next)
		if w.stopping() {
			return false
		}
	}
	return true
}

// committed tells those who wait on this group's progress. Drain cares
// only about a group that reached the end, so the partition's end, which
// every append writes, is read only after the last record of a read.
func (w *worker) committed(next int64) {
	w.gp.part.notifyCommit()
	if next >= w.readEnd && next >= w.gp.part.End() {
		w.g.broker.notifyProgress()
	}
}

// outcome is how the attempts on one record ended.
type outcome int

const (
	acked       outcome = iota // the handler returned nil: count it, commit it
	parked                     // failed for good and dead-lettered: commit it
	interrupted                // the worker was stopped first: no commit
	evicted                    // retention trimmed it before an attempt began: skip it
)

// deliver runs the attempts on rec.
//
// A record is delivered only while it is retained: one that retention trims
// before an attempt begins (DropOldest evicting it while it sat in the
// worker's batch, or while it waited out a backoff) is skipped and counted,
// exactly as if the worker had not read it yet.
func (w *worker) deliver(rec *Record) outcome {
	gp, g := w.gp, w.g
	hardStop := g.broker.handlerCtx
	attempt := 1
	if gp.retryOffset == rec.Offset {
		attempt = gp.attempts + 1 // an earlier worker already tried it
	}
	for {
		if gp.part.trimsUnread && rec.Offset < gp.part.trimmedBelow() {
			gp.retryOffset, gp.attempts = -1, 0
			return evicted
		}
		gp.retryOffset, gp.attempts = rec.Offset, attempt
		gp.setState(InFlight)
		err := w.call(rec, attempt)
		switch v := kit.Judge(err, attempt, g.spec.Retry.MaxAttempts); {
		case v == kit.Ack:
			gp.retryOffset, gp.attempts = -1, 0
			return acked
		case v == kit.NotDelivered:
			gp.attempts = attempt - 1 // it never happened
			return interrupted
		case v == kit.Abandoned, hardStop.Err() != nil:
			return interrupted
		case v == kit.DeadLetter:
			w.park(rec, w.delivery.ID, attempt, err)
			return parked
		}
		if !w.backoff(rec, attempt, err) {
			return interrupted
		}
		attempt++
	}
}

// call runs the handler (kit.Call: a panic becomes a *PanicError). The
// delivery it hands over is the worker's own, refilled per call: the
// handler may not keep it.
func (w *worker) call(rec *Record, attempt int) error {
	d := &w.delivery
	d.Record, d.Attempt = rec, attempt
	switch {
	case rec.ID != "":
		d.ID = rec.ID
	case w.gp.part.ids != nil:
		d.ID = w.gp.part.ids.id(rec.Offset)
	}
	return kit.Call(w.ctx, w.m.handler, d)
}

// park puts rec, named id, in the group's dead letters after attempt
// failed with err, and clears the partition's retry.
func (w *worker) park(rec *Record, id string, attempt int, err error) {
	gp, g := w.gp, w.g
	kept := *rec // the letter outlives the record and its buffers: see reclaimLocked
	kept.Key, kept.Value = bytes.Clone(rec.Key), bytes.Clone(rec.Value)
	letter := DeadLetter{
		Record:    &kept,
		ID:        id,
		Topic:     g.topic.name,
		Partition: gp.index,
		Group:     g.name,
		Attempts:  attempt,
		Err:       err,
		FailedAt:  g.broker.clock.Now(),
	}
	evicted := g.dlq.add(letter)
	if gp.keys == nil { // a keyed worker shows the state of the record holding its window (showKeys)
		gp.retryOffset, gp.attempts = -1, 0
		gp.setState(DeadLettered)
	}
	g.deadLettered.Add(1)
	if obs := g.broker.obs; obs != nil {
		e := &Event{Kind: engine.EventDeadLetter, Topic: letter.Topic, Group: g.name, Consumer: w.m.name,
			Partition: letter.Partition, Offset: rec.Offset, Attempt: attempt, ID: letter.ID, Letter: &letter, Err: err}
		if evicted {
			e.Count = 1
		}
		obs.Observe(e)
	}
}

// backoff counts a failed attempt that will be retried, reports it, and
// waits out its delay. It reports false when the worker was stopped first.
func (w *worker) backoff(rec *Record, attempt int, err error) bool {
	w.gp.setState(RetryScheduled)
	return kit.Wait(w.retrying(rec, attempt, err), w.stop, w.g.broker.handlerCtx.Done())
}

// retrying counts a failed attempt that will be retried, reports it, and
// returns the backoff to wait before the next.
func (w *worker) retrying(rec *Record, attempt int, err error) time.Duration {
	gp, g := w.gp, w.g
	g.retried.Add(1)
	delay := g.spec.Retry.Delay(attempt)
	if obs := g.broker.obs; obs != nil {
		obs.Observe(&Event{Kind: engine.EventRetry, Topic: g.topic.name, Group: g.name, Consumer: w.m.name,
			Partition: gp.index, Offset: rec.Offset, ID: w.recordID(rec), Record: rec, Attempt: attempt, Delay: delay, Err: err})
	}
	return delay
}

// callOne delivers rec alone, to whichever handler the member has: a
// batch consumer gets a batch of one.
func (w *worker) callOne(rec *Record, attempt int) error {
	if w.m.batch == nil {
		return w.call(rec, attempt)
	}
	w.one[0] = rec
	defer clear(w.one[:])
	_, err := kit.Outcome(w.callBatch(w.one[:], attempt), 1)
	return err
}

// recordID is rec's ID: the publisher's, else its position's.
func (w *worker) recordID(rec *Record) string {
	if rec.ID != "" || w.gp.part.ids == nil {
		return rec.ID
	}
	return w.gp.part.ids.id(rec.Offset)
}
