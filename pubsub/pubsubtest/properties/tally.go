package properties

import (
	"context"
	"maps"
	"slices"
	"sync"

	"pgregory.net/rapid"

	"github.com/logbus/logbus/pubsub"
)

// tally is a hook that counts what the broker reports, to check against
// its counters.
type tally struct {
	mu                                  sync.Mutex
	published, blocked, timedOut        int64
	dropped, expired                    int64
	retried, deadLettered, skipped, ack map[string]int64
}

func (y *tally) count(m *map[string]int64, group string, n int64) {
	y.mu.Lock()
	defer y.mu.Unlock()
	if *m == nil {
		*m = map[string]int64{}
	}
	(*m)[group] += n
}

func (y *tally) add(n *int64, d int64) {
	y.mu.Lock()
	defer y.mu.Unlock()
	*n += d
}

func (y *tally) OnPublished(_ context.Context, _ *pubsub.PublishInfo, _ pubsub.Position, err error) {
	if err == nil {
		y.add(&y.published, 1)
	}
}

func (y *tally) OnBackpressure(e pubsub.BackpressureEvent) {
	if e.Err == nil {
		y.add(&y.blocked, 1)
	} else {
		y.add(&y.timedOut, 1)
	}
}

func (y *tally) OnDrop(e pubsub.TrimEvent)   { y.add(&y.dropped, e.Count) }
func (y *tally) OnExpire(e pubsub.TrimEvent) { y.add(&y.expired, e.Count) }
func (y *tally) OnRetry(e pubsub.RetryEvent) { y.count(&y.retried, e.Delivery.Group, 1) }
func (y *tally) OnDeadLetter(e pubsub.DeadLetterEvent) {
	y.count(&y.deadLettered, e.Delivery.Group, 1)
}
func (y *tally) OnSkip(e pubsub.SkipEvent) { y.count(&y.skipped, e.Group, e.To-e.From) }
func (y *tally) OnDelivered(_ context.Context, d *pubsub.DeliveryInfo, r pubsub.DeliveryResult) {
	if r.Outcome == pubsub.OutcomeAcked {
		y.count(&y.ack, d.Group, 1)
	}
}

// checkTally: the hooks saw exactly what the counters count. Every
// publish stored, wait, timeout, drop and expiry of the topic, every
// retry, dead letter and skipped record of each group; and at least as
// many acked deliveries as the group counts delivered (an ack that came
// after Close returned is not counted).
func (m *machine) checkTally(t *rapid.T) {
	if m.tally == nil {
		return
	}
	y := m.tally
	y.mu.Lock()
	defer y.mu.Unlock()
	ts := m.topic.Stats()
	for what, got := range map[string][2]int64{
		"published": {y.published, ts.Published}, "waited for room": {y.blocked, ts.Blocked},
		"timed out": {y.timedOut, ts.TimedOut}, "dropped": {y.dropped, ts.Dropped}, "expired": {y.expired, ts.Expired},
	} {
		if got[0] != got[1] {
			t.Fatalf("hooks: the topic %s %d records by its hooks, %d by its stats", what, got[0], got[1])
		}
	}
	for _, group := range slices.Sorted(maps.Keys(m.groups)) {
		s := m.groups[group].Stats()
		for what, got := range map[string][2]int64{
			"retried": {y.retried[group], s.Retried}, "dead-lettered": {y.deadLettered[group], s.DeadLettered},
			"skipped": {y.skipped[group], s.Skipped},
		} {
			if got[0] != got[1] {
				t.Fatalf("hooks: %s %s %d records by its hooks, %d by its stats", group, what, got[0], got[1])
			}
		}
		if y.ack[group] < s.Delivered {
			t.Fatalf("hooks: %s acked %d deliveries by its hooks, but counts %d delivered", group, y.ack[group], s.Delivered)
		}
	}
}
