package core

import (
	"context"
	"sync"
	"sync/atomic"

	"github.com/logbus/logbus/internal/kit"
)

// redriveQueue holds the dead letters Redrive sent back to one (group,
// partition), for its worker to deliver again before it reads further.
// They are delivered in the order they were sent back, outside the
// partition's offset order (they are older records), and commit nothing:
// the group's offset is already past them.
type redriveQueue struct {
	mu      sync.Mutex // guards items
	items   []redriven
	pending atomic.Int32 // len(items), read by the worker per read without the lock
}

// redriven is one dead letter on its way back, with the attempts made on
// it since it was sent back (kept across workers, as groupPartition's are).
type redriven struct {
	letter   DeadLetter
	attempts int
}

// redriving is how many redriven dead letters wait on gp.
func (gp *groupPartition) redriving() int { return int(gp.redrive.pending.Load()) }

func (q *redriveQueue) push(items ...redriven) {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.items = append(q.items, items...)
	q.pending.Store(int32(len(q.items)))
}

// head returns the letter to deliver next, which stays queued (and
// counted in pending, so Drain waits for it) until done removes it.
func (q *redriveQueue) head() (redriven, bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if len(q.items) == 0 {
		return redriven{}, false
	}
	return q.items[0], true
}

// tried records the attempts made on the head, for the next worker if
// this one stops before it is done.
func (q *redriveQueue) tried(attempts int) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if len(q.items) > 0 {
		q.items[0].attempts = attempts
	}
}

// done removes the head: delivered, or dead-lettered again. It reports
// false when the queue is empty: Close took the letters back (see
// reparkRedriven) while a handler it gave up on still ran.
func (q *redriveQueue) done() bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	if len(q.items) == 0 {
		return false
	}
	q.items[0] = redriven{}
	q.items = q.items[1:]
	q.pending.Store(int32(len(q.items)))
	return true
}

// pop removes and returns the head, for Close to put back what was not
// delivered.
func (q *redriveQueue) pop() (redriven, bool) {
	it, ok := q.head()
	if ok {
		q.done()
	}
	return it, ok
}

// Redrive takes the dead letters match accepts (all when match is nil) out
// of the group's dead-letter queue and sends each back to this group only,
// to be delivered again by its partition's worker, attempts counted from 1;
// it returns how many it took (see engine.Redriver). It does not wait for
// them to be delivered (Drain does); ctx is for engines that must reach a
// server. match runs under no lock. After Close it fails with ErrClosed,
// and after the group was deleted with the deletion's error.
func (g *Group) Redrive(_ context.Context, match func(*DeadLetter) bool) (int, error) {
	if g.isStopped() {
		return 0, ErrClosed
	}
	if err := g.deletedErr(); err != nil {
		return 0, err
	}
	letters := g.dlq.take(match) // match runs here, under no lock
	if len(letters) == 0 {
		return 0, nil
	}
	// The letters go to the queues under mu, where shutdown marks the group
	// stopped: either they are queued before, and Close puts back what the
	// workers did not deliver (reparkRedriven), or Close began meanwhile
	// and they go straight back.
	g.mu.Lock()
	if g.stopped {
		g.mu.Unlock()
		for _, l := range letters {
			g.dlq.add(l)
		}
		return 0, ErrClosed
	}
	if err := g.deletedErr(); err != nil {
		g.mu.Unlock()
		return 0, err // deleted meanwhile: its letters are forgotten, these too
	}
	byPartition := make(map[int][]redriven)
	for _, l := range letters {
		byPartition[l.Partition] = append(byPartition[l.Partition], redriven{letter: l})
	}
	for p, items := range byPartition {
		g.parts[p].redrive.push(items...)
		// Wake the worker if it waits for records: its bell is rung, as an
		// append rings it.
		if w := g.parts[p].w; w != nil {
			select {
			case w.bell <- struct{}{}:
			default:
			}
		}
	}
	g.redriven.Add(int64(len(letters)))
	g.mu.Unlock()
	return len(letters), nil
}

// isStopped reports whether Close stopped the group, or began to.
func (g *Group) isStopped() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.stopped || g.broker.State() != Running
}

// take removes and returns, oldest first, the letters match accepts. match
// runs on a copy, outside the lock; a letter evicted meanwhile is not
// taken.
func (q *deadLetters) take(match func(*DeadLetter) bool) []DeadLetter {
	letters, _ := q.snapshot()
	chosen := make(map[*Record]bool)
	for i := range letters {
		if match == nil || match(&letters[i]) {
			chosen[letters[i].Record] = true
		}
	}
	return q.remove(chosen)
}

// redeliver delivers the redriven letters waiting on the worker's
// partition, one by one, retrying and dead-lettering them as deliver does
// a record but committing nothing. It reports false when the worker must
// exit; a letter it could not finish stays at the head of the queue, with
// its attempts, for the next worker.
func (w *worker) redeliver() bool {
	gp, g := w.gp, w.g
	// A record of the partition may be mid-retry, left by the previous
	// worker: its count is kept for after the redriven letters.
	retryOffset, attempts := gp.retryOffset, gp.attempts
	defer func() { gp.retryOffset, gp.attempts = retryOffset, attempts }()
	defer g.broker.notifyProgress() // Drain waits for redriven letters too
	hardStop := g.broker.handlerCtx
	for !w.stopping() {
		it, ok := gp.redrive.head()
		if !ok {
			return true
		}
		rec := it.letter.Record
		for {
			attempt := it.attempts + 1
			gp.attempts = attempt
			gp.setState(InFlight)
			err := w.callOne(rec, attempt)
			v := kit.Judge(err, attempt, g.spec.Retry.MaxAttempts)
			if v == kit.Ack {
				gp.acks++
				gp.attempts = 0
				gp.setState(Acked) // shown before the letter leaves the queue, which Drain watches
				if !gp.redrive.done() {
					// Close put the letter back in the dead letters while
					// the handler ran: like a record whose commit Close
					// refused (see deliverBatch), it is not delivered.
					gp.unack()
				}
				break
			}
			if v == kit.NotDelivered {
				return false // it never happened: the head keeps its attempts
			}
			it.attempts = attempt
			gp.redrive.tried(attempt)
			if v == kit.Abandoned || hardStop.Err() != nil {
				return false
			}
			if v == kit.DeadLetter {
				w.park(rec, it.letter.ID, attempt, err)
				gp.redrive.done()
				break
			}
			if !w.backoff(rec, attempt, err) {
				return false
			}
		}
	}
	return false
}

// redriving is how many redriven dead letters wait on the group's
// partitions.
func (g *Group) redriving() int {
	n := 0
	for _, gp := range g.parts {
		n += gp.redriving()
	}
	return n
}

// reparkRedriven puts the redriven letters that were not delivered again
// back in the dead letters, after Close stopped the workers: nothing that
// was sent back is lost.
func (g *Group) reparkRedriven() {
	for _, gp := range g.parts {
		for {
			it, ok := gp.redrive.pop()
			if !ok {
				break
			}
			g.dlq.add(it.letter)
		}
	}
}
