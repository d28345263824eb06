package jetstream

import (
	"sync"
	"time"

	"github.com/logbus/logbus/engine"
)

// watchdog finds this broker's deliveries that run longer than
// Config.StuckAfter, without touching the hot path: every half threshold
// it samples what each partition's worker already records under its
// slot's lock when a delivery begins (a count of deliveries begun, and
// whether one is in flight). A delivery still in flight with the count
// unchanged since the sample that first saw it has run since at least that
// sample: once that is a threshold ago, it is stuck. It reads no clock and
// counts its own ticks, so a delivery is reported between one and one and
// a half thresholds after it began, and RunningFor is short by up to half
// a threshold.
//
// Only this process's deliveries are seen: a handler running in another
// broker is that broker's watchdog's to report.
//
// It runs only when StuckAfter is set (one goroutine, started by Open,
// stopped by Close once the workers have stopped).
type watchdog struct {
	e      *eng
	after  time.Duration
	period time.Duration // after / 2
	stop   chan struct{} // closed by halt: the goroutine exits
	done   chan struct{} // closed when it has

	mu      sync.Mutex // guards tick and samples, which the snapshot reads
	tick    int64
	samples map[*slot]*sample
}

// sample is what the watchdog last saw of one partition's delivery.
type sample struct {
	starts   uint64
	inFlight bool
	since    int64 // the tick that first saw them
	reported bool  // EventStuck was raised for this delivery
	g        *group
	consumer string
	offset   int64
	attempt  int
}

func newWatchdog(e *eng, after time.Duration) *watchdog {
	return &watchdog{e: e, after: after, period: max(after/2, time.Millisecond),
		stop: make(chan struct{}), done: make(chan struct{}), samples: map[*slot]*sample{}}
}

// run samples until halt.
func (w *watchdog) run() {
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

// halt stops the goroutine and waits for it to exit. Idempotent.
func (w *watchdog) halt() {
	select {
	case <-w.stop:
	default:
		close(w.stop)
	}
	<-w.done
}

// seen is one slot's state, copied under its lock.
type seen struct {
	g        *group
	s        *slot
	starts   uint64
	inFlight bool
	consumer string
	offset   int64
	attempt  int
}

// sample looks at every partition of the local groups once and raises
// the events it finds, outside every lock.
func (w *watchdog) sample() {
	var now []seen
	for _, g := range w.e.localGroups() {
		for _, s := range g.slots {
			s.mu.Lock()
			now = append(now, seen{g: g, s: s, starts: s.starts, inFlight: s.inFlight,
				consumer: s.consumer, offset: s.offset, attempt: s.attempt})
			s.mu.Unlock()
		}
	}
	var events []*engine.Event
	w.mu.Lock()
	w.tick++
	for _, x := range now {
		sm := w.samples[x.s]
		if sm == nil {
			sm = &sample{g: x.g, since: w.tick}
			w.samples[x.s] = sm
		}
		if x.starts == sm.starts && x.inFlight == sm.inFlight {
			if sm.inFlight && !sm.reported && time.Duration(w.tick-sm.since)*w.period >= w.after {
				sm.reported = true
				events = append(events, w.event(engine.EventStuck, x.s, sm))
			}
			continue
		}
		if sm.reported { // the stuck delivery ended
			events = append(events, w.event(engine.EventUnstuck, x.s, sm))
		}
		*sm = sample{starts: x.starts, inFlight: x.inFlight, since: w.tick, g: x.g,
			consumer: x.consumer, offset: x.offset, attempt: x.attempt}
	}
	w.mu.Unlock()
	if obs := w.e.obs; obs != nil {
		for _, ev := range events {
			obs.Observe(ev)
		}
	}
}

// event describes the delivery sm sampled on s. w.mu is held.
func (w *watchdog) event(kind engine.EventKind, s *slot, sm *sample) *engine.Event {
	return &engine.Event{Kind: kind, Topic: sm.g.t.name, Group: sm.g.name, Consumer: sm.consumer, Partition: s.p,
		Offset: sm.offset, Attempt: sm.attempt, Delay: time.Duration(w.tick-sm.since) * w.period}
}

// runningFor is how long the delivery in flight on s, the starts-th, has
// run as far as the samples tell: 0 when no sample saw it yet.
func (w *watchdog) runningFor(s *slot, starts uint64) time.Duration {
	w.mu.Lock()
	defer w.mu.Unlock()
	sm := w.samples[s]
	if sm == nil || sm.starts != starts || !sm.inFlight {
		return 0
	}
	return time.Duration(w.tick-sm.since) * w.period
}
