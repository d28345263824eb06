package kit

import (
	"iter"
	"maps"
	"sync"
	"time"

	"github.com/logbus/logbus/engine"
)

// Progress is what the watchdog samples of one partition's deliveries:
// Word changes whenever a delivery begins (a count of deliveries begun, or
// of acks packed with the attempt: anything a new attempt changes), and
// InFlight says whether a handler runs now, on attempt Attempt.
type Progress struct {
	Word     uint64
	InFlight bool
	Attempt  int
}

// Probe is an engine's side of the watchdog: what it samples and how an
// event names the delivery. K identifies a partition of a group (its
// state's pointer, say).
type Probe[K comparable] interface {
	// Progress yields the progress of every partition of every group
	// delivering in this process, read without waiting for a handler.
	// It runs on the watchdog's goroutine, under none of its locks.
	Progress() iter.Seq2[K, Progress]
	// Describe fills in e the topic, group, consumer, partition and offset
	// of the delivery in flight on k, for EventStuck (EventUnstuck repeats
	// them). It runs on the watchdog's goroutine, under none of its locks.
	Describe(k K, e *engine.Event)
}

// Watchdog finds deliveries that run longer than a threshold, without
// touching the hot path: every half threshold it samples the progress the
// engine already keeps per partition (Probe). A partition InFlight whose
// Progress has not changed since the sample that first saw it has run one
// delivery since at least that sample: once that is a threshold ago, the
// delivery is stuck, reported once (EventStuck), and again when it ends
// (EventUnstuck). It reads no clock: it counts its own ticks, so a
// delivery is reported between one and one and a half thresholds after it
// began, and RunningFor is short by up to half a threshold.
//
// Only what the probe yields is watched: a distributed engine's handlers
// in other processes are theirs to report. A partition no longer yielded
// (its group was deleted) is forgotten, and so costs nothing here.
type Watchdog[K comparable] struct {
	probe  Probe[K]
	obs    engine.Observer
	after  time.Duration
	period time.Duration // after / 2
	stop   chan struct{} // closed by Halt: the goroutine exits
	halt   sync.Once
	done   chan struct{} // closed when it has

	reads []read[K] // the last tick's reads; only the goroutine touches it

	mu      sync.Mutex // guards tick and samples, which RunningFor reads
	tick    int64
	samples map[K]*sample
}

// sample is what the watchdog last saw of one partition.
type sample struct {
	p        Progress
	since    int64 // the tick that first saw p
	seen     int64 // the tick that last sampled it: an older one is no longer yielded
	reported bool  // EventStuck was raised for this delivery
	// event is the EventStuck raised, repeated by EventUnstuck. Only the
	// watchdog's goroutine touches it.
	event engine.Event
}

// StartWatchdog starts watching for deliveries running longer than after
// (positive), raising the events to obs when it is not nil. The caller
// must Halt it.
func StartWatchdog[K comparable](after time.Duration, probe Probe[K], obs engine.Observer) *Watchdog[K] {
	w := &Watchdog[K]{probe: probe, obs: obs, after: after, period: max(after/2, time.Millisecond),
		stop: make(chan struct{}), done: make(chan struct{}), samples: make(map[K]*sample)}
	go w.run() // exits when Halt is called
	return w
}

// run samples until Halt.
func (w *Watchdog[K]) run() {
	defer close(w.done)
	t := time.NewTicker(w.period)
	defer t.Stop()
	for {
		select {
		case <-w.stop:
			return
		case <-t.C:
			w.sample()
		}
	}
}

// Halt stops the watchdog and waits for its goroutine to exit. An engine
// halts it once its workers have exited. Idempotent.
func (w *Watchdog[K]) Halt() {
	w.halt.Do(func() { close(w.stop) })
	<-w.done
}

// read is one partition's progress as the probe yielded it.
type read[K comparable] struct {
	key K
	p   Progress
}

// found is an event sample found, to report once w.mu is released.
type found[K comparable] struct {
	kind  engine.EventKind
	key   K
	s     *sample
	delay time.Duration // how long the delivery had run
}

// sample looks at every partition once and raises the events it finds.
// The probe runs, and the events are raised, outside w.mu.
func (w *Watchdog[K]) sample() {
	w.reads = w.reads[:0]
	for k, p := range w.probe.Progress() {
		w.reads = append(w.reads, read[K]{k, p})
	}
	var events []found[K]
	w.mu.Lock()
	w.tick++
	for _, r := range w.reads {
		s := w.samples[r.key]
		if s == nil {
			s = &sample{p: r.p, since: w.tick}
			w.samples[r.key] = s
		}
		s.seen = w.tick
		ran := time.Duration(w.tick-s.since) * w.period
		if r.p == s.p {
			if r.p.InFlight && !s.reported && ran >= w.after {
				s.reported = true
				events = append(events, found[K]{engine.EventStuck, r.key, s, ran})
			}
			continue
		}
		if s.reported { // the stuck delivery ended
			events = append(events, found[K]{engine.EventUnstuck, r.key, s, ran})
		}
		s.p, s.since, s.reported = r.p, w.tick, false
	}
	// A partition no longer yielded (its group was deleted) is forgotten,
	// so that groups made and deleted over and over cost nothing here.
	maps.DeleteFunc(w.samples, func(_ K, s *sample) bool { return s.seen != w.tick })
	w.mu.Unlock()
	clear(w.reads) // keep no key alive until the next tick
	for _, f := range events {
		e := &f.s.event
		if f.kind == engine.EventStuck {
			*e = engine.Event{Attempt: f.s.p.Attempt}
			w.probe.Describe(f.key, e)
		}
		e.Kind, e.Delay = f.kind, f.delay
		if w.obs != nil {
			ev := *e // the observer may change nothing of the next report
			w.obs.Observe(&ev)
		}
	}
}

// RunningFor is how long the delivery in flight on k, whose progress is p
// now, has run as far as the samples tell: 0 when no sample saw it yet,
// or p is not InFlight.
func (w *Watchdog[K]) RunningFor(k K, p Progress) time.Duration {
	if !p.InFlight {
		return 0
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	s := w.samples[k]
	if s == nil || s.p != p {
		return 0
	}
	return time.Duration(w.tick-s.since) * w.period
}
