package core

import (
	"errors"
	"runtime/debug"
	"sync"
	"time"
)

// readBatch is how many records a worker takes from its partition per lock.
// A worker that wakes takes everything appended since, up to this many, and
// delivers them without touching the partition's lock again.
const readBatch = 64

// worker is the goroutine that serves one (group, partition): read at the
// committed offset, deliver, retry with backoff, dead-letter, commit. Being
// the only reader of the partition for its group is what orders the
// partition's records for the group.
//
// Its owner is the group, which starts it, signals it and waits for it.
type worker struct {
	g  *Group
	gp *groupPartition
	m  *member

	stop chan struct{} // closed by signal: finish the current delivery, then exit
	wg   sync.WaitGroup
	buf  [readBatch]*Record
}

func startWorker(g *Group, gp *groupPartition, m *member) *worker {
	w := &worker{g: g, gp: gp, m: m, stop: make(chan struct{})}
	// The goroutine exits when stop is closed (after its current delivery)
	// or when the broker's handler context ends.
	w.wg.Go(w.run)
	return w
}

func (w *worker) signal() { close(w.stop) }
func (w *worker) wait()   { w.wg.Wait() }

func (w *worker) stopping() bool {
	select {
	case <-w.stop:
		return true
	default:
		return false
	}
}

func (w *worker) run() {
	defer clear(w.buf[:]) // drop the references so trimmed records can be freed
	part, cursor := w.gp.part, w.gp.cursor
	for !w.stopping() {
		// Read the offset afresh each turn: it is the group's, not ours.
		offset := cursor.Committed()
		n, skipTo, ready := part.Read(offset, w.buf[:])
		switch {
		case skipTo > offset:
			// Retention trimmed records this group had not read. Skip to the
			// earliest one and count the gap: visible loss, never silent.
			if cursor.Commit(offset, skipTo) {
				w.g.skipped.Add(skipTo - offset)
				w.committed(skipTo)
			}
			continue
		case n == 0:
			select {
			case <-ready:
			case <-w.stop:
				return
			}
			continue
		}
		for i, rec := range w.buf[:n] {
			w.buf[i] = nil
			if !w.deliver(rec) {
				return // stopped without an outcome: no commit, redelivered later
			}
			if !cursor.Commit(rec.Offset, rec.Offset+1) {
				break // the cursor moved under us; cannot happen while seeks stop us first
			}
			w.committed(rec.Offset + 1)
			if w.stopping() {
				return
			}
		}
	}
}

// committed tells those who wait on this group's progress.
func (w *worker) committed(next int64) {
	w.gp.part.notifyCommit()
	if next >= w.gp.part.End() {
		w.g.broker.notifyProgress()
	}
}

// deliver runs the attempts on rec. It reports true when rec has an outcome
// (acked or dead-lettered) and its offset may be committed, and false when
// the worker was stopped first.
func (w *worker) deliver(rec *Record) bool {
	gp, g := w.gp, w.g
	hardStop := g.broker.handlerCtx
	attempt := 1
	if gp.retryOffset == rec.Offset {
		attempt = gp.attempts + 1 // an earlier worker already tried it
	}
	for {
		gp.retryOffset, gp.attempts = rec.Offset, attempt
		gp.state.Store(int32(InFlight))
		err := w.call(rec, attempt)
		switch {
		case err == nil:
			gp.retryOffset, gp.attempts = -1, 0
			gp.state.Store(int32(Acked))
			g.delivered.Add(1)
			return true
		case errors.Is(err, ErrAbandoned), hardStop.Err() != nil:
			return false
		case errors.Is(err, ErrPermanent) || attempt >= g.retry.MaxAttempts:
			g.dlq.add(DeadLetter{
				Record:   rec,
				Group:    g.name,
				Attempts: attempt,
				Err:      err,
				FailedAt: g.broker.clock.Now(),
			})
			gp.retryOffset, gp.attempts = -1, 0
			gp.state.Store(int32(DeadLettered))
			g.deadLettered.Add(1)
			return true
		}
		g.retried.Add(1)
		gp.state.Store(int32(RetryScheduled))
		t := time.NewTimer(g.retry.Delay(attempt))
		select {
		case <-t.C:
		case <-w.stop:
			t.Stop()
			return false
		case <-hardStop.Done():
			t.Stop()
			return false
		}
		attempt++
	}
}

// call runs the handler, turning a panic into a *PanicError.
func (w *worker) call(rec *Record, attempt int) (err error) {
	defer func() {
		if v := recover(); v != nil {
			err = &PanicError{Value: v, Stack: debug.Stack()}
		}
	}()
	return w.m.handler(w.g.broker.handlerCtx, rec, attempt)
}
