package kit

import (
	"fmt"
	"slices"
	"testing"

	"pgregory.net/rapid"

	"github.com/logbus/logbus/engine"
)

// keyModel is the simple model of a KeyWindow: every record added since
// the last reset, with its key and where it stands, and the rules written
// as plainly as they read.
type keyModel struct {
	n     int
	first int64 // the offset of recs[0]
	recs  []modelRec
}

type modelRec struct {
	key    int // -1: keyless
	state  slotState
	absent bool // added absent, not yet come
}

func (m *keyModel) end() int64 { return m.first + int64(len(m.recs)) }

// committed is the lowest unsettled offset, or the end.
func (m *keyModel) committed() int64 {
	for i, r := range m.recs {
		if r.state != slotSettled {
			return m.first + int64(i)
		}
	}
	return m.end()
}

func (m *keyModel) count(s slotState) int {
	n := 0
	for _, r := range m.recs {
		if r.state == s {
			n++
		}
	}
	return n
}

// startable reports whether record i may start: it waits to, and every
// earlier record of its key has settled.
func (m *keyModel) startable(i int) bool {
	r := m.recs[i]
	if r.state != slotReady || r.absent {
		return false
	}
	if r.key < 0 {
		return true
	}
	for _, e := range m.recs[:i] {
		if e.key == r.key && e.state != slotSettled {
			return false
		}
	}
	return true
}

// next is the record Next must return: the lowest startable offset while
// fewer than n are in flight.
func (m *keyModel) next() (int64, bool) {
	if m.count(slotRunning) >= m.n {
		return 0, false
	}
	for i := range m.recs {
		if m.startable(i) {
			return m.first + int64(i), true
		}
	}
	return 0, false
}

// in returns the offsets of the records in state s.
func (m *keyModel) in(s slotState) []int64 {
	var out []int64
	for i, r := range m.recs {
		if r.state == s {
			out = append(out, m.first+int64(i))
		}
	}
	return out
}

type keyMachine struct {
	w *KeyWindow
	m *keyModel
}

func (k *keyMachine) Add(t *rapid.T) {
	if int(k.m.end()-k.m.committed()) >= engine.KeyWindowSize(k.m.n) {
		if k.w.Room() != 0 {
			t.Fatalf("Room: %d, want 0 with %d records from %d to %d", k.w.Room(), k.m.end()-k.m.committed(), k.m.committed(), k.m.end())
		}
		t.Skip("the window is full")
	}
	key := rapid.IntRange(-1, 4).Draw(t, "key")
	k.w.Add(fmt.Appendf(nil, "key-%d", key), key < 0)
	k.m.recs = append(k.m.recs, modelRec{key: key, state: slotReady})
}

// AddMany fills the window, to reach its bound.
func (k *keyMachine) AddMany(t *rapid.T) {
	for range rapid.IntRange(1, 40).Draw(t, "many") {
		if k.w.Room() == 0 {
			return
		}
		key := rapid.IntRange(-1, 2).Draw(t, "key")
		k.w.Add(fmt.Appendf(nil, "key-%d", key), key < 0)
		k.m.recs = append(k.m.recs, modelRec{key: key, state: slotReady})
	}
}

// AddAbsent adds a record the window knows of and does not hold.
func (k *keyMachine) AddAbsent(t *rapid.T) {
	if k.w.Room() == 0 {
		t.Skip("the window is full")
	}
	key := rapid.IntRange(-1, 4).Draw(t, "key")
	k.w.AddAbsent(fmt.Appendf(nil, "key-%d", key), key < 0)
	k.m.recs = append(k.m.recs, modelRec{key: key, state: slotReady, absent: true})
}

func (k *keyMachine) Arrive(t *rapid.T) {
	var offs []int64
	for i, r := range k.m.recs {
		if r.absent && r.state != slotSettled {
			offs = append(offs, k.m.first+int64(i))
		}
	}
	if len(offs) == 0 {
		t.Skip("no absent record")
	}
	o := rapid.SampledFrom(offs).Draw(t, "arrive")
	k.w.Arrive(o)
	k.m.recs[o-k.m.first].absent = false
}

// Pass settles a record out of flight, in whatever state: waiting for its
// key, ready, retrying, absent, or settled already.
func (k *keyMachine) Pass(t *rapid.T) {
	var offs []int64
	for i, r := range k.m.recs {
		if r.state != slotRunning {
			offs = append(offs, k.m.first+int64(i))
		}
	}
	if len(offs) == 0 {
		t.Skip("no record out of flight")
	}
	o := rapid.SampledFrom(offs).Draw(t, "pass")
	k.w.Pass(o)
	k.m.recs[o-k.m.first].state = slotSettled
}

func (k *keyMachine) Next(t *rapid.T) {
	want, wantOK := k.m.next()
	got, ok := k.w.Next()
	if got != want || ok != wantOK {
		t.Fatalf("Next: got %d, %v; the model says %d, %v", got, ok, want, wantOK)
	}
	if ok {
		k.m.recs[got-k.m.first].state = slotRunning
	}
}

// pick draws one of the records in state s, skipping when there is none.
func (k *keyMachine) pick(t *rapid.T, s slotState, label string) int64 {
	offs := k.m.in(s)
	if len(offs) == 0 {
		t.Skip("no record to " + label)
	}
	return rapid.SampledFrom(offs).Draw(t, label)
}

func (k *keyMachine) Settle(t *rapid.T) {
	o := k.pick(t, slotRunning, "settle")
	k.w.Settle(o)
	k.m.recs[o-k.m.first].state = slotSettled
}

func (k *keyMachine) Fail(t *rapid.T) {
	o := k.pick(t, slotRunning, "fail")
	k.w.Fail(o)
	k.m.recs[o-k.m.first].state = slotRetrying
}

func (k *keyMachine) Retry(t *rapid.T) {
	o := k.pick(t, slotRetrying, "retry")
	k.w.Retry(o)
	k.m.recs[o-k.m.first].state = slotReady
}

func (k *keyMachine) GiveBack(t *rapid.T) {
	o := k.pick(t, slotRunning, "giveBack")
	k.w.GiveBack(o)
	k.m.recs[o-k.m.first].state = slotReady
}

func (k *keyMachine) Reset(t *rapid.T) {
	o := rapid.Int64Range(0, 1000).Draw(t, "resetTo")
	k.w.Reset(o)
	k.m.first, k.m.recs = o, nil
}

// Check holds the window to the model: the committed offset is the lowest
// unsettled one (never past it, and reaching it), no two records of one
// key are in flight, at most n are, and the counts agree.
func (k *keyMachine) Check(t *rapid.T) {
	m := k.m
	if got, want := k.w.Committed(), m.committed(); got != want {
		t.Fatalf("Committed: got %d, the lowest unsettled offset is %d", got, want)
	}
	if got, want := k.w.End(), m.end(); got != want {
		t.Fatalf("End: got %d, want %d", got, want)
	}
	if got, want := k.w.Room(), engine.KeyWindowSize(m.n)-int(m.end()-m.committed()); got != want {
		t.Fatalf("Room: got %d, want %d", got, want)
	}
	if got, want := k.w.InFlight(), m.count(slotRunning); got != want || got > m.n {
		t.Fatalf("InFlight: got %d, want %d (at most %d)", got, want, m.n)
	}
	if got, want := k.w.Unsettled(), len(m.recs)-m.count(slotSettled); got != want {
		t.Fatalf("Unsettled: got %d, want %d", got, want)
	}
	ready := 0
	for i := range m.recs {
		if m.startable(i) {
			ready++
		}
	}
	if got := k.w.Ready(); got != ready {
		t.Fatalf("Ready: got %d, want %d", got, ready)
	}
	var keys []int
	for i, r := range m.recs {
		o := m.first + int64(i)
		if k.w.Running(o) != (r.state == slotRunning) || k.w.Retrying(o) != (r.state == slotRetrying) ||
			k.w.Settled(o) != (r.state == slotSettled) || k.w.Absent(o) != (r.absent && r.state != slotSettled) {
			t.Fatalf("offset %d: Running %v, Retrying %v, Settled %v, Absent %v; the model has it %d, absent %v",
				o, k.w.Running(o), k.w.Retrying(o), k.w.Settled(o), k.w.Absent(o), r.state, r.absent)
		}
		if r.state != slotRunning || r.key < 0 {
			continue
		}
		if slices.Contains(keys, r.key) {
			t.Fatalf("two records of key %d in flight", r.key)
		}
		keys = append(keys, r.key)
		for _, e := range m.recs[:i] {
			if e.key == r.key && e.state != slotSettled {
				t.Fatalf("offset %d of key %d in flight before an earlier record of its key settled", o, r.key)
			}
		}
	}
}

// The window keeps its rules against a model written as plainly as they
// read, whatever the order of records, outcomes, retries and resets.
func TestKeyWindowKeepsItsRules(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		n := rapid.SampledFrom([]int{1, 2, 3, 8}).Draw(t, "n")
		start := rapid.Int64Range(0, 100).Draw(t, "start")
		k := &keyMachine{w: NewKeyWindow(n, start), m: &keyModel{n: n, first: start}}
		t.Repeat(rapid.StateMachineActions(k))
	})
}

// A slow key holds the committed offset at its record while the other keys
// run on, up to the window's bound; once it settles, the offset jumps past
// everything settled behind it.
func TestKeyWindowHoldsTheCommitAtASlowKey(t *testing.T) {
	w := NewKeyWindow(4, 10)
	w.Add([]byte("slow"), false)
	for i := range engine.KeyWindowSize(4) - 1 {
		w.Add(fmt.Appendf(nil, "k%d", i%8), false)
	}
	if w.Room() != 0 {
		t.Fatalf("Room: %d, want 0 once the window holds %d records", w.Room(), engine.KeyWindowSize(4))
	}
	slow, _ := w.Next()
	for {
		o, ok := w.Next()
		if !ok {
			break
		}
		w.Settle(o)
	}
	if w.Committed() != 10 || w.Unsettled() != 1 || w.InFlight() != 1 {
		t.Fatalf("Committed %d, Unsettled %d, InFlight %d; want 10, 1, 1 while the slow key runs", w.Committed(), w.Unsettled(), w.InFlight())
	}
	w.Settle(slow)
	if want := int64(10 + engine.KeyWindowSize(4)); w.Committed() != want || w.Room() != engine.KeyWindowSize(4) {
		t.Fatalf("Committed %d, Room %d; want %d and %d", w.Committed(), w.Room(), want, engine.KeyWindowSize(4))
	}
}

// Adding, starting and settling a record allocates nothing once the
// window has seen its keys.
func TestKeyWindowAllocatesNothingPerRecord(t *testing.T) {
	w := NewKeyWindow(16, 0)
	keys := make([][]byte, 64)
	for i := range keys {
		keys[i] = fmt.Appendf(nil, "key-%d", i)
	}
	i := 0
	allocs := testing.AllocsPerRun(1000, func() {
		w.Add(keys[i%len(keys)], false)
		i++
		o, _ := w.Next()
		w.Settle(o)
	})
	if allocs != 0 {
		t.Errorf("a record costs %v allocations, want 0", allocs)
	}
}

// A window taking over from another process knows the records it had
// read and not settled only as absent: a record of their key waits for
// them, whether one comes (Arrive) and is settled here, or the other
// process had settled it (Pass); other keys run at once.
func TestKeyWindowHoldsAKeyBehindItsAbsentRecords(t *testing.T) {
	w := NewKeyWindow(4, 0)
	w.AddAbsent([]byte("a"), false) // 0: the other process had it in flight
	w.AddAbsent([]byte("b"), false) // 1: the other process acked it
	w.Add([]byte("a"), false)       // 2
	w.Add([]byte("b"), false)       // 3
	w.Add([]byte("c"), false)       // 4
	if o, ok := w.Next(); !ok || o != 4 {
		t.Fatalf("Next: %d, %v; want 4, the only key no absent record holds", o, ok)
	}
	if _, ok := w.Next(); ok {
		t.Fatal("a record behind an absent one of its key started")
	}
	w.Pass(1)
	if o, ok := w.Next(); !ok || o != 3 {
		t.Fatalf("Next once 1 passed: %d, %v; want 3", o, ok)
	}
	w.Arrive(0)
	if o, ok := w.Next(); !ok || o != 0 {
		t.Fatalf("Next once 0 came: %d, %v; want 0", o, ok)
	}
	if _, ok := w.Next(); ok {
		t.Fatal("2 started while 0, of its key, runs")
	}
	w.Settle(0)
	if o, ok := w.Next(); !ok || o != 2 || w.Committed() != 2 {
		t.Fatalf("Next once 0 settled: %d, %v, Committed %d; want 2, and 2", o, ok, w.Committed())
	}
}
