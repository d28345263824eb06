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

// This file is the worker's loop for a group with key concurrency n > 1
// (GroupSpec.KeyConcurrency). It keeps the per-record loop's rules (one
// worker per (group, partition), which alone reads and commits; a record
// committed only once it settled; retries, dead letters, panics and
// decode failures judged by kit.Judge) and changes one thing: the worker
// no longer runs the handler itself. It reads records into a
// kit.KeyWindow, which decides which may start, hands those to n handler
// goroutines it owns, and commits what the window says: the lowest
// unsettled offset.
//
// The worker goroutine alone touches the window and the group's
// bookkeeping; the handler goroutines only call the handler and send the
// result back. So everything a result changes (the window, the counters,
// the dead letters, the commit, the events) happens on one goroutine, in
// the order the results came, as in the per-record loop.
//
// The window outlives the worker, as retryOffset does: a worker that stops
// (a pause, a rebalance) waits for its deliveries in flight only, and
// leaves the window to its successor, which delivers what it had not
// settled and nothing it had. So a clean hand-over redelivers nothing, and
// Leave and Pause wait for the deliveries in flight, as without key
// concurrency. A record waiting out a backoff when its worker stops is
// retried at once by the successor, with its attempts counted on. A seek
// or a replay discards the window (keyed.discard).

// keyed is the state of key concurrency on one (group, partition). win
// and recs are touched only by the worker serving the partition, or by a
// seek while none does: Group.mu, which a worker takes to exit and a seek
// holds, orders the accesses (as for retryOffset).
type keyed struct {
	win  *kit.KeyWindow // nil until a worker starts, and after a seek
	recs []keyedRec     // the window's records: recs[o % len(recs)] for o in [win.Committed(), win.End())

	// Read without a lock by Snapshot; written by the worker.
	running atomic.Int32 // deliveries in flight
	oldest  atomic.Int64 // the oldest unsettled offset; -1 when none

	// The record holding the window (the one at the committed offset), for
	// the stuck watchdog's report (see stuckProbe.Describe): copied by the
	// worker when it changes, only when the broker watches for stuck
	// deliveries, since the watchdog must not read a record that may be
	// reclaimed and reused under it.
	heldMu      sync.Mutex // guards the fields below
	heldOff     int64
	heldKey     []byte
	heldKeyless bool
	heldCreated time.Time
}

func newKeyed() *keyed {
	k := &keyed{heldOff: -1}
	k.oldest.Store(-1)
	return k
}

// discard forgets the window: a seek or a replay moved the cursor, and
// the next worker starts a window there. Called under Group.mu while no
// worker runs; a nil k (no key concurrency) does nothing.
func (k *keyed) discard() {
	if k == nil {
		return
	}
	k.win = nil
	clear(k.recs)
	k.oldest.Store(-1)
}

// keyedRec is one record of the window.
type keyedRec struct {
	rec      *Record
	attempts int  // attempts made on it, across workers
	acked    bool // settled by an ack: counted as delivered once committed
	skipped  bool // passed over, trimmed before it started: counted as skipped once committed
}

// keyJob is a delivery the worker hands to a handler goroutine.
type keyJob struct {
	rec     *Record
	attempt int
	id      string
}

// keyResult is how a delivery ended, sent back to the worker.
type keyResult struct {
	offset  int64
	attempt int
	err     error
}

// keyRetry is a record waiting out its backoff until at.
type keyRetry struct {
	offset int64
	at     time.Time
}

// keyLoop is one worker's run of the keyed loop.
type keyLoop struct {
	w       *worker
	k       *keyed
	jobs    chan keyJob    // to the handler goroutines; room for n, so handing over never blocks
	results chan keyResult // from them; room for n, so a handler never waits for the worker
	retries []keyRetry     // the records waiting out a backoff, in no order
	timer   *time.Timer    // fires at the earliest retry; made on first use
	waiting bool           // the last read found nothing: the bell rings when records come
	// done ends the loop once no delivery is in flight, without a stop:
	// a delivery was given back (its consumer is going away; see
	// worker.hold), or Close sealed the cursor.
	done bool
}

// runKeys is the worker's loop for a group with key concurrency.
func (w *worker) runKeys() {
	k, n := w.gp.keys, w.g.spec.KeyConcurrency
	if k.win == nil {
		k.win = kit.NewKeyWindow(n, w.gp.cursor.Committed())
		if len(k.recs) == 0 {
			k.recs = make([]keyedRec, engine.KeyWindowSize(n))
		}
	}
	l := &keyLoop{w: w, k: k, jobs: make(chan keyJob, n), results: make(chan keyResult, n)}
	var handlers sync.WaitGroup
	w.startHandlers(n, l.jobs, l.results, &handlers)
	defer func() {
		close(l.jobs)   // the handlers are idle: the loop waited for every delivery in flight
		handlers.Wait() // so they exit at once
		l.release()
		l.show()
	}()
	l.run()
}

// handle is a handler goroutine: it delivers each job it is given and
// sends back how it ended, until jobs is closed.
func (w *worker) handle(ctx context.Context, s *handlerSlot, jobs <-chan keyJob, results chan<- keyResult) {
	d := Delivery{Topic: w.g.topic.name, Partition: w.gp.index, Revoked: w.stop}
	for j := range jobs {
		off := j.rec.Offset
		d.Record, d.Attempt, d.ID = j.rec, j.attempt, j.id
		s.offset.Store(off)
		err := kit.Call(ctx, w.m.handler, &d)
		s.offset.Store(-1)
		d.Record = nil // keep no record alive past its delivery
		results <- keyResult{offset: off, attempt: j.attempt, err: err}
	}
}

func (l *keyLoop) run() {
	w, win := l.w, l.k.win
	for {
		stopping := w.stopping() || l.done
		if stopping && win.InFlight() == 0 {
			return
		}
		if !stopping {
			if w.gp.redrive.pending.Load() > 0 {
				// Dead letters sent back come first, delivered one by one
				// on this goroutine as without key concurrency, once no
				// delivery is in flight: a letter's key may be one of
				// theirs.
				if win.InFlight() == 0 {
					if !w.redeliver() {
						l.done = true // stopped, or the letter was given back
					}
					continue
				}
			} else {
				l.read()
				if l.dispatch() {
					continue // it passed over trimmed records: the window moved, so read again
				}
			}
		}
		var bell, stop <-chan struct{}
		var due <-chan time.Time
		if !stopping {
			stop = w.stop
			if l.waiting {
				bell = w.bell
			}
			if len(l.retries) > 0 {
				due = l.timer.C
			}
		}
		l.show() // before waiting: what Snapshot and the watchdog see while nothing changes
		select {
		case r := <-l.results:
			l.result(r)
			// Take the other results already there too: one pass then
			// reads, starts and shows for all of them.
			for more := true; more; {
				select {
				case r := <-l.results:
					l.result(r)
				default:
					more = false
				}
			}
		case <-bell:
			l.waiting = false
		case <-due:
			l.wake()
		case <-stop:
		}
	}
}

// slot is where offset's record is in recs.
func (l *keyLoop) slot(offset int64) *keyedRec {
	return &l.k.recs[offset%int64(len(l.k.recs))]
}

// read adds to the window what the partition holds past it, as far as the
// window has room.
func (l *keyLoop) read() {
	w, win := l.w, l.k.win
	part := w.gp.part
	for room := win.Room(); room > 0; room = win.Room() {
		end := win.End()
		n, skipTo, waiting := part.Read(end, w.buf[:min(room, readBatch)], w.gp.cursor, w.bell)
		switch {
		case skipTo > end:
			// Retention trimmed records past the window before it read
			// them. The window's own records, trimmed too, are passed
			// over as they come up (see dispatch); once it is empty the
			// gap is skipped and counted, as without key concurrency.
			if win.Unsettled() > 0 {
				return
			}
			w.readEnd = skipTo
			if !w.skip(end, skipTo) {
				l.done = true // Close sealed the cursor
				return
			}
			win.Reset(skipTo)
			continue
		case waiting:
			l.waiting = true
			return
		}
		for _, rec := range w.buf[:n] {
			*l.slot(rec.Offset) = keyedRec{rec: rec}
			win.Add(rec.Key, rec.Key == nil)
		}
		clear(w.buf[:n])
	}
}

// dispatch starts every record the window lets start. It reports whether
// it passed over records retention trimmed, which settles them at once.
func (l *keyLoop) dispatch() (passed bool) {
	w, win := l.w, l.k.win
	part := w.gp.part
	for {
		off, ok := win.Next()
		if !ok {
			break
		}
		kr := l.slot(off)
		if part.trimsUnread && off < part.trimmedBelow() {
			// Trimmed before an attempt began (DropOldest evicted it while
			// it waited in the window, or out a backoff): passed over, and
			// counted as skipped once the commit passes it, as if it had
			// never been read.
			kr.skipped = true
			win.Settle(off)
			l.commit()
			passed = true
			continue
		}
		l.jobs <- keyJob{rec: kr.rec, attempt: kr.attempts + 1, id: w.recordID(kr.rec)}
	}
	return passed
}

// result applies how a delivery ended, as deliver does for one record.
func (l *keyLoop) result(r keyResult) {
	w, win, g := l.w, l.k.win, l.w.g
	kr := l.slot(r.offset)
	switch v := kit.Judge(r.err, r.attempt, g.spec.Retry.MaxAttempts); {
	case v == kit.Ack:
		kr.attempts, kr.acked = r.attempt, true
		win.Settle(r.offset)
	case v == kit.NotDelivered:
		kr.attempts = r.attempt - 1 // it never happened
		win.GiveBack(r.offset)
		l.done = true
	case v == kit.Abandoned:
		kr.attempts = r.attempt
		win.GiveBack(r.offset)
		l.done = true
	case g.broker.handlerCtx.Err() != nil:
		// Close gave up on the handlers: what they say counts for nothing,
		// and the record is delivered again, its attempt counted.
		kr.attempts = r.attempt
		win.GiveBack(r.offset)
	case v == kit.DeadLetter:
		kr.attempts = r.attempt
		w.park(kr.rec, w.recordID(kr.rec), r.attempt, r.err)
		win.Settle(r.offset)
	default:
		kr.attempts = r.attempt
		delay := w.retrying(kr.rec, r.attempt, r.err)
		win.Fail(r.offset)
		l.retryAfter(r.offset, delay)
	}
	l.commit()
}

// commit moves the cursor to the window's committed offset, counting the
// acks it passes as delivered and the records passed over as skipped (so
// that, as without key concurrency, the counts are those of the offsets
// committed; a seek discards the rest of the window uncounted). Once
// committed, a record may be reclaimed and reused (see Record): the loop
// forgets it.
func (l *keyLoop) commit() {
	w, win := l.w, l.k.win
	cur, next := w.gp.cursor.Committed(), win.Committed()
	if next <= cur {
		return
	}
	var acks uint64
	var skips []int64 // the offsets passed over, in order
	for o := cur; o < next; o++ {
		kr := l.slot(o)
		if kr.acked {
			acks++
		}
		if kr.skipped {
			skips = append(skips, o)
		}
		*kr = keyedRec{}
	}
	// The acks are shown before the commit, which may wake Drain: a
	// drained group's Stats count them (as deliverBatch's do).
	w.gp.acks += acks
	l.show()
	if !w.gp.cursor.Commit(cur, next) {
		// Close sealed the cursor while the handlers ran: the records are
		// not delivered, so their acks do not count either (see
		// deliverBatch).
		w.gp.acks -= acks
		l.show()
		l.done = true
		return
	}
	w.readEnd = win.End()
	if len(skips) > 0 {
		w.g.skipped.Add(int64(len(skips)))
		for i := 0; i < len(skips); { // one event per run of consecutive offsets
			j := i + 1
			for j < len(skips) && skips[j] == skips[j-1]+1 {
				j++
			}
			w.observeSkip(skips[i], skips[j-1]+1)
			i = j
		}
	}
	w.committed(next)
}

// retryAfter has offset retried once d has passed.
func (l *keyLoop) retryAfter(offset int64, d time.Duration) {
	l.retries = append(l.retries, keyRetry{offset: offset, at: time.Now().Add(d)})
	l.arm()
}

// arm sets the timer to the earliest retry.
func (l *keyLoop) arm() {
	at := l.retries[0].at
	for _, r := range l.retries[1:] {
		if r.at.Before(at) {
			at = r.at
		}
	}
	if l.timer == nil {
		l.timer = time.NewTimer(time.Until(at))
	} else {
		l.timer.Reset(time.Until(at))
	}
}

// wake makes the records whose backoff is over ready to start again.
func (l *keyLoop) wake() {
	now := time.Now()
	left := l.retries[:0]
	for _, r := range l.retries {
		if r.at.After(now) {
			left = append(left, r)
		} else {
			l.k.win.Retry(r.offset)
		}
	}
	clear(l.retries[len(left):])
	l.retries = left
	if len(left) > 0 {
		l.arm()
	}
}

// release ends the loop's backoffs: the records waiting them out are
// ready at once for the next worker, which retries them straight away, as
// the per-record loop's successor does.
func (l *keyLoop) release() {
	for _, r := range l.retries {
		l.k.win.Retry(r.offset)
	}
	l.retries = nil
	if l.timer != nil {
		l.timer.Stop()
	}
}

// show publishes the partition's state for Snapshot, Stats and the stuck
// watchdog: the deliveries in flight, the oldest unsettled offset, and in
// the progress word the acks committed and the state and attempt of the
// record holding the window (the oldest unsettled one).
func (l *keyLoop) show() {
	k, gp := l.k, l.w.gp
	win := k.win
	k.running.Store(int32(win.InFlight()))
	state, attempt, oldest := Pending, 0, int64(-1)
	if win.Unsettled() > 0 {
		oldest = win.Committed()
		kr := l.slot(oldest)
		switch {
		case win.Running(oldest):
			state, attempt = InFlight, kr.attempts+1
		case win.Retrying(oldest):
			state, attempt = RetryScheduled, kr.attempts
		}
		if l.w.g.broker.stuck != nil && k.oldest.Load() != oldest {
			k.heldMu.Lock()
			k.heldOff, k.heldCreated, k.heldKeyless = oldest, kr.rec.Created, kr.rec.Key == nil
			k.heldKey = append(k.heldKey[:0], kr.rec.Key...)
			k.heldMu.Unlock()
		}
	} else if gp.acks > 0 {
		state = Acked
	}
	k.oldest.Store(oldest)
	if word := gp.acks<<progressAcks | uint64(min(attempt, 0xff))<<8 | uint64(state); gp.progress.Load() != word {
		gp.progress.Store(word)
	}
}

// held describes the record holding the window, if it is still the one
// at offset: a copy of its key and when it was created.
func (k *keyed) held(offset int64) (*Record, bool) {
	k.heldMu.Lock()
	defer k.heldMu.Unlock()
	if k.heldOff != offset {
		return nil, false
	}
	rec := &Record{Offset: offset, Key: bytes.Clone(k.heldKey), Created: k.heldCreated}
	if k.heldKeyless {
		rec.Key = nil
	} else if rec.Key == nil {
		rec.Key = []byte{} // an empty key is a key
	}
	return rec, true
}
