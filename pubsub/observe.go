package pubsub

import "time"

// observer is what watches a broker: its hooks, sorted by kind once, its
// logger, its stuck threshold. A Broker that nothing observes has none,
// so the hot paths pay one nil check.
type observer struct {
	stuck time.Duration
}

// stuckAfter is the WithStuckAfter threshold, 0 when off.
func (o *observer) stuckAfter() time.Duration {
	if o == nil {
		return 0
	}
	return o.stuck
}
