package main

import (
	"encoding/binary"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"time"
)

// payloadSize is the size of every message body, for every peer.
const payloadSize = 64

// sampleEvery: the latency run records the latency of every sampleEvery-th
// message. Taking time.Now on every delivery would add to the cost being
// measured; one in 16 still gives thousands of samples per run.
const sampleEvery = 16

// Payload layout, the same for every peer (logbus-json carries the same two
// numbers in struct fields instead):
//
//	[0:8)   publish time, UnixNano, little endian; 0 in throughput runs
//	[8:16)  sequence number in [0, n): what delivery is checked against
//	[16:64) filler
//
// The throughput runs leave the stamp at 0 so that time.Now is not part of
// the per-message cost being compared; the paced latency runs stamp it.
func fillPayload(b []byte, seq uint64, stamp bool) {
	var sent int64
	if stamp {
		sent = time.Now().UnixNano()
	}
	binary.LittleEndian.PutUint64(b[0:8], uint64(sent))
	binary.LittleEndian.PutUint64(b[8:16], seq)
}

// newPayload returns a fresh payload, for peers that keep a reference to
// what they are given (channels, watermill) so the producer cannot reuse a
// buffer.
func newPayload(seq uint64, stamp bool) []byte {
	b := make([]byte, payloadSize)
	fillPayload(b, seq, stamp)
	return b
}

// tracker checks delivery: every group must see every sequence number, and
// it counts the duplicates. It also collects the latency samples.
//
// It is shared by all consumers of a run, so it uses atomics only: a mutex
// here would serialise the consumers and distort the comparison.
type tracker struct {
	n      int
	groups int
	seen   [][]atomic.Uint32 // [group][seq]: deliveries of seq to group
	left   atomic.Int64      // first deliveries still missing, over all groups
	dups   atomic.Int64      // deliveries beyond the first
	bad    atomic.Int64      // payloads that were not ours (short, seq out of range)
	done   chan struct{}     // closed when left reaches 0
	sample bool
	lat    [][]atomic.Int64 // [group][seq/sampleEvery]: latency in ns, 0 = none
}

func newTracker(n, groups int, sample bool) *tracker {
	t := &tracker{n: n, groups: groups, done: make(chan struct{}), sample: sample}
	t.seen = make([][]atomic.Uint32, groups)
	t.lat = make([][]atomic.Int64, groups)
	for g := range groups {
		t.seen[g] = make([]atomic.Uint32, n)
		if sample {
			t.lat[g] = make([]atomic.Int64, n/sampleEvery+1)
		}
	}
	t.left.Store(int64(n) * int64(groups))
	if n == 0 {
		close(t.done)
	}
	return t
}

// deliver records that group received payload p.
func (t *tracker) deliver(group int, p []byte) {
	if len(p) < 16 {
		t.bad.Add(1)
		return
	}
	t.deliverSeq(group, binary.LittleEndian.Uint64(p[8:16]), int64(binary.LittleEndian.Uint64(p[0:8])))
}

// deliverSeq records that group received message seq, published at sent
// (UnixNano; 0 when not stamped).
func (t *tracker) deliverSeq(group int, seq uint64, sent int64) {
	if seq >= uint64(t.n) || group < 0 || group >= t.groups {
		t.bad.Add(1)
		return
	}
	if t.sample && sent != 0 && seq%sampleEvery == 0 {
		d := time.Now().UnixNano() - sent
		if d <= 0 {
			d = 1 // keep 0 meaning "no sample"
		}
		t.lat[group][seq/sampleEvery].Store(d)
	}
	if t.seen[group][seq].Add(1) != 1 {
		t.dups.Add(1)
		return
	}
	if t.left.Add(-1) == 0 {
		close(t.done)
	}
}

// wait blocks until every group saw every message, or timeout.
func (t *tracker) wait(timeout time.Duration) error {
	tm := time.NewTimer(timeout)
	defer tm.Stop()
	select {
	case <-t.done:
		return t.check()
	case <-tm.C:
		total := int64(t.n) * int64(t.groups)
		return fmt.Errorf("timed out after %v: %d of %d deliveries (n=%d × %d groups) arrived, %d duplicates, %d foreign payloads",
			timeout, total-t.left.Load(), total, t.n, t.groups, t.dups.Load(), t.bad.Load())
	}
}

func (t *tracker) check() error {
	if b := t.bad.Load(); b > 0 {
		return fmt.Errorf("%d deliveries carried a payload that was never published", b)
	}
	return nil
}

// latencies returns the samples in nanoseconds.
func (t *tracker) latencies() []float64 {
	var out []float64
	for g := range t.lat {
		for i := range t.lat[g] {
			if v := t.lat[g][i].Load(); v > 0 {
				out = append(out, float64(v))
			}
		}
	}
	return out
}

// result is one run of one peer in one scenario.
type result struct {
	msgs    int           // messages published (each seen by every group)
	elapsed time.Duration // first publish to last delivery (and commit, where the peer has one)
	mallocs uint64        // runtime.MemStats.Mallocs delta over the same span, whole process
	dups    int64         // deliveries beyond the first
	lat     []float64     // latency samples, ns; paced runs only
	diag    string        // peer-specific counters for the progress log (stderr)
}

// finish fills the parts of r that come from the tracker.
func (t *tracker) finish(r *result) {
	r.msgs = t.n
	r.dups = t.dups.Load()
	if t.sample {
		r.lat = t.latencies()
	}
}

// meter brackets the measured span. It counts Mallocs of the whole process,
// so allocations of the peer's background goroutines (a NATS server's, a
// broker's workers) are included, and so is the benchmark's own payload
// allocation where a peer needs a fresh slice per message.
type meter struct {
	t0 time.Time
	m0 uint64
}

func startMeter() meter {
	// A collection before each run so that one run's garbage is not
	// collected on the next run's clock.
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return meter{t0: time.Now(), m0: ms.Mallocs}
}

func (m meter) stop(r *result) {
	r.elapsed = time.Since(m.t0)
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	r.mallocs = ms.Mallocs - m.m0
}

// runProducers runs sc.producers goroutines; producer p sends the sequence
// numbers [p·n/P, (p+1)·n/P) by calling send. In a paced run each producer
// keeps to sc.pace/P messages a second. It returns when every producer has
// returned, with the first error.
func runProducers(sc scenario, n int, send func(p int, seq uint64) error) error {
	return runProducerBatches(sc, n, 1, func(p int, first uint64, _ int) error { return send(p, first) })
}

// runProducerBatches is runProducers for peers that take several messages
// per call: send gets the messages [first, first+count) of producer p's
// share, at most batchSize at a time. Paced, a producer sends what fell due
// while it slept, up to batchSize: a batch never waits for a message that is
// not due yet, so batching adds no delay of its own to the latency runs.
func runProducerBatches(sc scenario, n, batchSize int, send func(p int, first uint64, count int) error) error {
	P := sc.producers
	var (
		wg    sync.WaitGroup
		errMu sync.Mutex
		first error
	)
	start := time.Now()
	for p := range P {
		lo, hi := p*n/P, (p+1)*n/P
		var pc *pacer
		if sc.pace > 0 {
			pc = &pacer{start: start, nsPer: 1e9 / (sc.pace / float64(P))}
		}
		wg.Go(func() {
			for i := lo; i < hi; {
				pc.wait(i - lo)
				count := 1
				for count < batchSize && i+count < hi && pc.due(i+count-lo) {
					count++
				}
				if err := send(p, uint64(i), count); err != nil {
					errMu.Lock()
					if first == nil {
						first = fmt.Errorf("producer %d, messages %d..%d: %w", p, i, i+count-1, err)
					}
					errMu.Unlock()
					return
				}
				i += count
			}
		})
	}
	wg.Wait()
	return first
}

// pacer spaces one producer's messages nsPer apart. It sleeps until each
// message is due rather than spinning, because a spinning producer would
// take a whole core of the two from the consumers. The Go timer wakes tens
// of microseconds late, so at high rates the messages leave in small bursts
// (everything that fell due while asleep); that burstiness is part of what
// the latency run measures, equally for every peer.
type pacer struct {
	start time.Time
	nsPer float64
}

// due reports whether message i is due; without a pacer every message is.
func (p *pacer) due(i int) bool {
	return p == nil || !time.Now().Before(p.start.Add(time.Duration(float64(i)*p.nsPer)))
}

func (p *pacer) wait(i int) {
	if p == nil {
		return
	}
	due := p.start.Add(time.Duration(float64(i) * p.nsPer))
	if d := time.Until(due); d > 0 {
		time.Sleep(d)
	}
}

// firstErr keeps the first error reported from a callback goroutine.
type firstErr struct {
	mu  sync.Mutex
	err error
}

func (f *firstErr) set(err error) {
	f.mu.Lock()
	if f.err == nil {
		f.err = err
	}
	f.mu.Unlock()
}

func (f *firstErr) get() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.err
}
