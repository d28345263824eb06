package core

import (
	"slices"
	"sync"
)

// deadLetters is one group's dead-letter queue: bounded, oldest evicted
// first, every eviction counted.
type deadLetters struct {
	mu      sync.Mutex // guards letters and evicted
	limit   int
	letters []DeadLetter
	evicted int64
}

// add appends l, evicting the oldest letter when the queue is full, and
// reports whether it did. A queue whose limit is 0 keeps nothing: l itself
// is evicted, and counted.
func (q *deadLetters) add(l DeadLetter) (evicted bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.limit == 0 {
		q.evicted++
		return true
	}
	if len(q.letters) == q.limit {
		copy(q.letters, q.letters[1:])
		q.letters = q.letters[:len(q.letters)-1]
		q.evicted++
		evicted = true
	}
	q.letters = append(q.letters, l)
	return evicted
}

// snapshot returns a copy of the letters, oldest first, and the eviction count.
func (q *deadLetters) snapshot() ([]DeadLetter, int64) {
	q.mu.Lock()
	defer q.mu.Unlock()
	return append([]DeadLetter(nil), q.letters...), q.evicted
}

// remove removes and returns, oldest first, the letters whose records are
// chosen: a letter is known by its record, a copy of its own (see
// worker.park).
func (q *deadLetters) remove(chosen map[*Record]bool) []DeadLetter {
	if len(chosen) == 0 {
		return nil
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	var out []DeadLetter
	q.letters = slices.DeleteFunc(q.letters, func(l DeadLetter) bool {
		if chosen[l.Record] {
			out = append(out, l)
			return true
		}
		return false
	})
	return out
}

// counts returns how many letters the queue holds and how many it
// evicted, without copying the letters.
func (q *deadLetters) counts() (held int, evicted int64) {
	q.mu.Lock()
	defer q.mu.Unlock()
	return len(q.letters), q.evicted
}
