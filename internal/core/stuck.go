package core

import (
	"maps"
	"sync"
	"time"

	"github.com/logbus/logbus/engine"
)

// watchdog finds deliveries that run longer than a threshold, without
// touching the hot path: it samples the progress word each worker already
// stores per delivery (state, attempt and acks in one word, see
// groupPartition.progress) every half threshold. A word that shows
// InFlight and has not changed since the sample that first saw it belongs
// to one delivery that has run since at least that sample: once that is a
// threshold ago, the delivery is stuck. It reads no clock: it counts its
// own ticks, so a delivery is reported between one and one and a half
// thresholds after it began, and RunningFor is short by up to half a
// threshold.
//
// It runs only when Config.StuckAfter is set (one goroutine, started by
// NewBroker, stopped by Close); without it nothing samples and nothing
// ticks.
type watchdog struct {
	b      *Broker
	after  time.Duration
	period time.Duration // after / 2
	stop   chan struct{} // closed by Close: the goroutine exits
	done   chan struct{} // closed when it has

	mu      sync.Mutex // guards tick and samples, which the snapshot reads
	tick    int64
	samples map[*groupPartition]*sample
}

// sample is what the watchdog last saw of one partition's progress.
type sample struct {
	word     uint64
	since    int64 // the tick that first saw word
	seen     int64 // the tick that last sampled it: an older one's group was deleted
	reported bool  // EventStuck was raised for this delivery
	g        *Group
	consumer string // the owner when it was reported
	offset   int64  // the record in flight when it was reported
}

func newWatchdog(b *Broker, after time.Duration) *watchdog {
	return &watchdog{b: b, after: after, period: max(after/2, time.Millisecond),
		stop: make(chan struct{}), done: make(chan struct{}), samples: make(map[*groupPartition]*sample)}
}

// run samples until stop is closed.
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

// halt stops the goroutine and waits for it to exit.
func (w *watchdog) halt() {
	close(w.stop)
	<-w.done
}

// sample looks at every group partition once and raises the events it
// finds, after releasing its lock.
func (w *watchdog) sample() {
	var events []*Event
	w.mu.Lock()
	w.tick++
	for _, g := range w.b.groupList() {
		for _, gp := range g.parts {
			word := gp.progress.Load()
			s := w.samples[gp]
			if s == nil {
				s = &sample{g: g}
				w.samples[gp] = s
			}
			s.seen = w.tick
			if word == s.word {
				if state, _, _ := unpackProgress(word); state == InFlight && !s.reported &&
					time.Duration(w.tick-s.since)*w.period >= w.after {
					s.reported = true
					events = append(events, w.event(engine.EventStuck, gp, s, word))
				}
				continue
			}
			if s.reported { // the stuck delivery ended
				events = append(events, w.event(engine.EventUnstuck, gp, s, s.word))
			}
			s.word, s.since, s.reported = word, w.tick, false
		}
	}
	// A deleted group's partitions are no longer listed: forget them, so
	// that groups made and deleted over and over cost nothing here.
	maps.DeleteFunc(w.samples, func(_ *groupPartition, s *sample) bool { return s.seen != w.tick })
	w.mu.Unlock()
	if obs := w.b.obs; obs != nil {
		for _, e := range events {
			obs.Observe(e)
		}
	}
}

// event describes the delivery of gp that s sampled. w.mu is held; the
// group's lock is taken briefly for the owner's name.
func (w *watchdog) event(kind EventKind, gp *groupPartition, s *sample, word uint64) *Event {
	_, attempt, _ := unpackProgress(word)
	if kind == engine.EventStuck {
		// The record in flight is the one at the committed offset (or a
		// redriven letter): the worker commits each before the next.
		s.offset = gp.cursor.Committed()
		s.g.mu.Lock()
		if gp.owner != nil {
			s.consumer = gp.owner.name
		}
		s.g.mu.Unlock()
	}
	return &Event{Kind: kind, Topic: s.g.topic.name, Group: s.g.name, Consumer: s.consumer, Partition: gp.index,
		Offset: s.offset, Attempt: attempt, Delay: time.Duration(w.tick-s.since) * w.period}
}

// runningFor is how long the delivery in flight on gp has run, as far as
// the samples tell: 0 when no sample saw it yet.
func (w *watchdog) runningFor(gp *groupPartition) time.Duration {
	w.mu.Lock()
	defer w.mu.Unlock()
	s := w.samples[gp]
	if s == nil || s.word != gp.progress.Load() {
		return 0
	}
	return time.Duration(w.tick-s.since) * w.period
}
