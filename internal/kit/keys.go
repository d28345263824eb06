package kit

import (
	"fmt"
	"hash/maphash"

	"github.com/logbus/logbus/engine"
)

// KeyWindow is the policy of key-level concurrency in one partition of one
// group, the same for every engine: which records may start, and how far
// the committed offset may move. It is pure and synchronous: no
// goroutines, no clock, no locks. One goroutine (the partition's worker)
// owns it; an engine tells it of the records it read, in offset order,
// and of how each attempt ended, and asks it what may start.
//
// Its rules:
//   - at most n records are in flight (started, their attempt not ended);
//   - never two in flight with equal keys (compared by their encoded
//     bytes; keyless records are each a key of their own);
//   - a record starts only after every earlier record of its key has
//     settled: per-key order, across retries too;
//   - a record is settled when it was acked or dead-lettered (Settle); a
//     failed attempt that will be retried (Fail) leaves it unsettled, its
//     key held, until a later attempt settles it; a record given back
//     (GiveBack) may start again;
//   - a record the engine knows of but does not hold (AddAbsent: another
//     process read it, and the server delivers it again in its own time)
//     holds its key like any unsettled record, and starts only once it
//     came (Arrive); one settled elsewhere, or passed over, settles
//     without starting (Pass);
//   - the committed offset (Committed) is the lowest unsettled offset, or
//     the end when everything read has settled: it reaches it, and never
//     passes an unsettled record;
//   - no more than engine.KeyWindowSize(n) records lie between the committed offset
//     and the end (Room): a record that stays unsettled stops the reading
//     that far past it.
//
// Among the records that may start, Next picks the lowest offset, so the
// committed offset moves as soon as it can.
type KeyWindow struct {
	n     int
	seed  maphash.Seed
	base  int64     // the lowest unsettled offset; end when none is
	end   int64     // one past the last record added
	slots []keySlot // record o in slots[o % len(slots)], for o in [base, end)
	// tails maps the hash of each key with an unsettled record to its
	// newest unsettled record: the one a new record of the key waits
	// behind.
	tails     map[uint64]int64
	ready     offsetHeap // records that may start, lowest first
	running   int        // records in flight
	unsettled int        // records in [base, end) not settled
}

// keySlot is one record of the window.
type keySlot struct {
	state  slotState
	keyed  bool
	absent bool   // added by AddAbsent, not yet come (Arrive)
	hash   uint64 // the key's hash, when keyed
	// next is the next record of the same key added after this one (-1
	// when none): it waits until this one settles. A record passed while
	// it waited (Pass) stays in the chain, settled, until the records
	// before it settle.
	next int64
}

// slotState is where a record of the window stands.
type slotState uint8

const (
	slotWaiting  slotState = iota // behind an earlier record of its key
	slotReady                     // may start (in ready)
	slotRunning                   // in flight
	slotRetrying                  // its attempt failed; it waits to be retried (Retry), its key held
	slotAbsent                    // its turn came, but it has not come (AddAbsent, Arrive)
	slotSettled                   // acked or dead-lettered
)

// NewKeyWindow returns the window of a partition whose committed offset
// is start, for n records in flight at most (1 <= n): empty, the next
// record to add being start's.
func NewKeyWindow(n int, start int64) *KeyWindow {
	if n < 1 {
		panic(fmt.Sprintf("kit: NewKeyWindow(%d): n must be at least 1", n))
	}
	w := &KeyWindow{n: n, seed: maphash.MakeSeed(), slots: make([]keySlot, engine.KeyWindowSize(n)), tails: make(map[uint64]int64)}
	w.Reset(start)
	return w
}

// Reset empties the window, which starts again at offset: a seek or a
// replay discards what was read and not settled.
func (w *KeyWindow) Reset(offset int64) {
	clear(w.slots)
	clear(w.tails)
	w.ready = w.ready[:0]
	w.base, w.end, w.running, w.unsettled = offset, offset, 0, 0
}

// Committed is the lowest unsettled offset, or End when every record read
// has settled: the offset the group may commit.
func (w *KeyWindow) Committed() int64 { return w.base }

// End is the offset of the next record to Add.
func (w *KeyWindow) End() int64 { return w.end }

// Room is how many records may be added now: engine.KeyWindowSize(n) minus the
// records from Committed to End.
func (w *KeyWindow) Room() int { return len(w.slots) - int(w.end-w.base) }

// InFlight is how many records are in flight: started, their attempt not
// ended.
func (w *KeyWindow) InFlight() int { return w.running }

// Unsettled is how many records were added and have not settled: in
// flight, waiting to be retried, or waiting to start.
func (w *KeyWindow) Unsettled() int { return w.unsettled }

// Add tells the window of the record at End, whose encoded key is key
// (keyless: nil, a key of its own). It panics when there is no Room: the
// caller reads no more than Room records.
func (w *KeyWindow) Add(key []byte, keyless bool) { w.add(key, keyless, false) }

// AddAbsent is Add for a record the engine knows of but does not hold: a
// distributed engine taking over a partition from another process, whose
// server delivers the records that process had not settled again in its
// own time. The record holds its key like any unsettled one (the records
// of its key behind it wait), and does not start until Arrive says it
// came; Pass settles it when it was settled elsewhere.
func (w *KeyWindow) AddAbsent(key []byte, keyless bool) { w.add(key, keyless, true) }

func (w *KeyWindow) add(key []byte, keyless, absent bool) {
	if w.Room() <= 0 {
		panic("kit: KeyWindow.Add without room")
	}
	off := w.end
	w.end++
	w.unsettled++
	s := w.slot(off)
	*s = keySlot{state: slotReady, absent: absent, next: -1}
	if !keyless {
		s.keyed, s.hash = true, maphash.Bytes(w.seed, key)
		// Two keys with equal hashes are treated as one: their records
		// wait for each other, which costs concurrency and breaks no
		// rule. With 64 bits and a random seed it does not happen.
		if tail, ok := w.tails[s.hash]; ok {
			w.slot(tail).next = off
			s.state = slotWaiting
		}
		w.tails[s.hash] = off
	}
	if s.state == slotReady {
		w.turn(s, off)
	}
}

// turn makes s, at offset, the record its key is at: it may start, or
// once it came when it is absent.
func (w *KeyWindow) turn(s *keySlot, offset int64) {
	if s.absent {
		s.state = slotAbsent
		return
	}
	s.state = slotReady
	w.ready.push(offset)
}

// Next returns a record that may start now and marks it in flight: the
// lowest offset among those whose key holds no earlier unsettled record,
// provided fewer than n are in flight. ok is false when none may.
func (w *KeyWindow) Next() (offset int64, ok bool) {
	if w.running >= w.n || len(w.ready) == 0 {
		return 0, false
	}
	off := w.ready.pop()
	w.slot(off).state = slotRunning
	w.running++
	return off, true
}

// Settle tells the window that the attempt on offset, in flight, settled
// it: acked, dead-lettered, or passed over (retention trimmed it before
// it could start). The next record of its key may start, and the
// committed offset moves past every settled record at its head.
func (w *KeyWindow) Settle(offset int64) {
	s := w.inFlightSlot(offset, "Settle")
	w.running--
	w.settle(s, offset)
}

// settle settles s, at offset, the record its key is at: the next
// unsettled record of its key takes its turn, and the committed offset
// moves past every settled record at its head.
func (w *KeyWindow) settle(s *keySlot, offset int64) {
	w.unsettled--
	s.state = slotSettled
	if s.keyed {
		last, next := offset, s.next
		for next >= 0 && w.slot(next).state == slotSettled { // passed while they waited
			last, next = next, w.slot(next).next
		}
		if next >= 0 {
			w.turn(w.slot(next), next)
		} else if w.tails[s.hash] == last {
			delete(w.tails, s.hash)
		}
	}
	for w.base < w.end && w.slot(w.base).state == slotSettled {
		*w.slot(w.base) = keySlot{}
		w.base++
	}
}

// Arrive tells the window that offset, added by AddAbsent, came: it may
// start once every earlier record of its key settled.
func (w *KeyWindow) Arrive(offset int64) {
	s := w.slot(offset)
	if offset < w.base || offset >= w.end || !s.absent || s.state == slotSettled {
		panic(fmt.Sprintf("kit: KeyWindow.Arrive(%d): not an absent record of [%d, %d)", offset, w.base, w.end))
	}
	s.absent = false
	if s.state == slotAbsent {
		w.turn(s, offset)
	}
}

// Pass settles offset without an attempt of this window's: it was
// settled elsewhere (the process that had it before acked it), or it is
// passed over (retention took it). It must not be in flight; a record
// already settled, or below Committed, is left as it is. A record of a
// key whose earlier records have not settled stays behind them, settled:
// the next record of its key waits for them still.
func (w *KeyWindow) Pass(offset int64) {
	if offset < w.base {
		return
	}
	s := w.slot(offset)
	if offset >= w.end || s.state == slotRunning {
		panic(fmt.Sprintf("kit: KeyWindow.Pass(%d): not a record of [%d, %d) out of flight", offset, w.base, w.end))
	}
	switch s.state {
	case slotSettled:
	case slotWaiting:
		w.unsettled--
		s.state = slotSettled // the chain walks past it when the records before it settle
	case slotReady:
		w.ready.remove(offset)
		w.settle(s, offset)
	default: // retrying, absent
		w.settle(s, offset)
	}
}

// Fail tells the window that the attempt on offset, in flight, failed and
// will be retried: it is no longer in flight but stays unsettled, and its
// key stays held (the records of the key behind it wait) until Retry.
func (w *KeyWindow) Fail(offset int64) {
	s := w.inFlightSlot(offset, "Fail")
	w.running--
	s.state = slotRetrying
}

// Retry makes offset, which failed (Fail), ready to start again: its
// backoff is over, or the worker that waited for it stopped and the next
// one retries it at once.
func (w *KeyWindow) Retry(offset int64) {
	s := w.slot(offset)
	if offset < w.base || offset >= w.end || s.state != slotRetrying {
		panic(fmt.Sprintf("kit: KeyWindow.Retry(%d): not a failed record of [%d, %d)", offset, w.base, w.end))
	}
	s.state = slotReady
	w.ready.push(offset)
}

// GiveBack tells the window that offset, in flight, was given back
// without an outcome (the consumer did not take it, or left): it is no
// longer in flight and may start again.
func (w *KeyWindow) GiveBack(offset int64) {
	s := w.inFlightSlot(offset, "GiveBack")
	w.running--
	s.state = slotReady
	w.ready.push(offset)
}

// Retrying reports whether offset failed and waits to be retried.
func (w *KeyWindow) Retrying(offset int64) bool {
	return offset >= w.base && offset < w.end && w.slot(offset).state == slotRetrying
}

// Running reports whether offset is in flight.
func (w *KeyWindow) Running(offset int64) bool {
	return offset >= w.base && offset < w.end && w.slot(offset).state == slotRunning
}

// Absent reports whether offset was added by AddAbsent, is unsettled and
// has not come.
func (w *KeyWindow) Absent(offset int64) bool {
	if offset < w.base || offset >= w.end {
		return false
	}
	s := w.slot(offset)
	return s.absent && s.state != slotSettled
}

// Settled reports whether offset, below End, has settled: below
// Committed, or settled after it.
func (w *KeyWindow) Settled(offset int64) bool {
	return offset < w.base || offset < w.end && w.slot(offset).state == slotSettled
}

// Ready is how many records may start as soon as fewer than n are in
// flight: Next returns them, lowest first.
func (w *KeyWindow) Ready() int { return len(w.ready) }

func (w *KeyWindow) slot(offset int64) *keySlot { return &w.slots[offset%int64(len(w.slots))] }

// inFlightSlot returns offset's slot, which must be in flight.
func (w *KeyWindow) inFlightSlot(offset int64, op string) *keySlot {
	s := w.slot(offset)
	if offset < w.base || offset >= w.end || s.state != slotRunning {
		panic(fmt.Sprintf("kit: KeyWindow.%s(%d): not in flight in [%d, %d)", op, offset, w.base, w.end))
	}
	return s
}

// offsetHeap is a min-heap of offsets.
type offsetHeap []int64

func (h *offsetHeap) push(o int64) {
	*h = append(*h, o)
	s := *h
	for i := len(s) - 1; i > 0; {
		p := (i - 1) / 2
		if s[p] <= s[i] {
			break
		}
		s[p], s[i] = s[i], s[p]
		i = p
	}
}

func (h *offsetHeap) pop() int64 {
	top := (*h)[0]
	h.removeAt(0)
	return top
}

// remove takes o out of the heap: a linear search, for the rare record
// passed while it was ready.
func (h *offsetHeap) remove(o int64) {
	for i, x := range *h {
		if x == o {
			h.removeAt(i)
			return
		}
	}
}

func (h *offsetHeap) removeAt(i int) {
	s := *h
	last := len(s) - 1
	s[i] = s[last]
	s = s[:last]
	*h = s
	if i == last {
		return
	}
	for j := i; j > 0; { // up, when the moved offset is below its parent
		p := (j - 1) / 2
		if s[p] <= s[j] {
			break
		}
		s[p], s[j] = s[j], s[p]
		j = p
	}
	for {
		l, r, m := 2*i+1, 2*i+2, i
		if l < len(s) && s[l] < s[m] {
			m = l
		}
		if r < len(s) && s[r] < s[m] {
			m = r
		}
		if m == i {
			break
		}
		s[i], s[m] = s[m], s[i]
		i = m
	}
}
