package conformance

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing/synctest"
	"time"

	"github.com/logbus/logbus/engine"
	"github.com/logbus/logbus/pubsub"
)

func observeCases() []confCase {
	return []confCase{
		{name: "Snapshot lists every topic and group with committed offsets, lag and counters", run: func(c *conf) {
			b := c.broker()
			orders := c.topic(b, "orders", pubsub.WithPartitions(2))
			c.topic(b, "audit")
			g := subscribe(c, orders, "billing", "b1", pubsub.HandlerFunc[string](func(context.Context, pubsub.Message[string]) error { return nil }))
			subscribe(c, orders, "shipping", "s1", pubsub.HandlerFunc[string](func(context.Context, pubsub.Message[string]) error { return nil }))
			pos := publish(c, orders, "alice", "1")
			c.drain(b)
			if err := g.Pause(c.ctx()); err != nil {
				c.Fatalf("Pause: %v", err)
			}
			publish(c, orders, "alice", "2")
			s := b.Snapshot()
			var names []string
			for _, t := range s.Topics {
				names = append(names, t.Name)
			}
			if !slices.Equal(names, []string{"audit", "orders"}) || s.State != pubsub.Running {
				c.Fatalf("snapshot topics %v, state %v; want [audit orders], running", names, s.State)
			}
			ot := s.Topics[1]
			if ot.Stats.Published != 2 || len(ot.Partitions) != 2 || ot.Partitions[pos.Partition].End != 2 {
				c.Errorf("orders: stats %+v, partitions %+v; want 2 published, partition %d ending at 2", ot.Stats, ot.Partitions, pos.Partition)
			}
			if len(ot.Groups) != 2 || ot.Groups[0].Name != "billing" || ot.Groups[1].Name != "shipping" {
				c.Fatalf("orders groups %+v, want billing and shipping", ot.Groups)
			}
			bg := ot.Groups[0]
			bp := bg.Partitions[pos.Partition]
			if bg.Lag != 1 || bp.Lag != 1 || bp.Committed != 1 || bp.Owner != "b1" || bg.Stats.Delivered != 1 ||
				!slices.Equal(bg.Consumers, []string{"b1"}) || !slices.Equal(bg.Assignment["b1"], []int{0, 1}) {
				c.Errorf("billing: %+v, want lag 1 on partition %d committed at 1, b1 owning both, 1 delivered", bg, pos.Partition)
			}
			if !s.Partial && !bg.Paused {
				c.Errorf("billing is paused, a full snapshot says %v", bg.Paused)
			}
			if err := g.Resume(c.ctx()); err != nil {
				c.Fatalf("Resume: %v", err)
			}
			c.drain(b)
		}},
		{name: "Snapshot shows the delivery in flight, its attempt and the lag in time", needs: engine.Snapshots, run: func(c *conf) {
			b, topic := c.brokerTopic("orders")
			started, release := make(chan struct{}), make(chan struct{})
			subscribe(c, topic, "billing", "b1", pubsub.HandlerFunc[string](func(_ context.Context, m pubsub.Message[string]) error {
				if m.Attempt == 1 {
					close(started)
					<-release
					return errBoom
				}
				return nil
			}))
			publishValue(c, topic, "v")
			select {
			case <-started:
			case <-c.ctx().Done():
				c.Fatal("the handler was never called")
			}
			s := b.Snapshot()
			p := s.Topics[0].Groups[0].Partitions[0]
			if s.Partial || !p.InFlight || p.Attempt != 1 || p.Lag != 1 || p.Oldest.IsZero() || p.LagAge != s.Taken.Sub(p.Oldest) || p.LagAge < 0 {
				c.Errorf("partition %+v (taken %v), want in flight at attempt 1, lag 1, an Oldest and LagAge = Taken − Oldest", p, s.Taken)
			}
			if p.Running != 1 || p.OldestUnsettled != 0 {
				c.Errorf("partition %+v, want 1 running and the oldest unsettled offset 0", p)
			}
			close(release)
			c.drain(b)
			if p := b.Snapshot().Topics[0].Groups[0].Partitions[0]; p.InFlight || p.Lag != 0 || !p.Oldest.IsZero() || p.Running != 0 || p.OldestUnsettled != -1 {
				c.Errorf("after Drain: %+v, want idle with no lag, none running, no unsettled offset (-1)", p)
			}
		}},
		{name: "publish and delivery hooks see every record, and headers a publish hook adds reach the handler", run: func(c *conf) {
			h := &confHooks{}
			b := c.broker(pubsub.WithHooks(h))
			topic := c.topic(b, "orders")
			log := &callLog[string]{fail: func(m pubsub.Message[string]) error {
				if m.Value == "bad" {
					return fmt.Errorf("no: %w", pubsub.ErrPermanent)
				}
				return nil
			}}
			subscribe(c, topic, "billing", "b1", log)
			publish(c, topic, "k", "ok")
			publish(c, topic, "k", "bad")
			c.drain(b)
			want := []string{
				"publish orders/0 k", "published orders/0@0", "publish orders/0 k", "published orders/0@1",
				"deliver billing@0 attempt 1", "delivered billing@0 acked", "deliver billing@1 attempt 1", "delivered billing@1 failed",
			}
			got := slices.DeleteFunc(h.all(), func(l string) bool { return !isTypedEvent(l) })
			if !sameEvents(got, want) {
				c.Errorf("events %q, want %q (publishes before deliveries per record)", got, want)
			}
			for _, m := range log.all() {
				if m.Headers["hooked"] != "yes" {
					c.Errorf("message %d headers %v, want the hook's", m.Offset, m.Headers)
				}
			}
		}},
		{name: "a failed delivery raises a retry, then a dead letter", needs: engine.Observed, run: func(c *conf) {
			h := &confHooks{}
			b := c.broker(pubsub.WithHooks(h))
			topic := c.topic(b, "orders")
			subscribe(c, topic, "billing", "b1", &callLog[string]{fail: func(pubsub.Message[string]) error { return errBoom }},
				pubsub.WithGroupRetry(pubsub.RetryPolicy{MaxAttempts: 2}))
			publish(c, topic, "k", "bad")
			c.drain(b)
			got := slices.DeleteFunc(h.all(), func(l string) bool { return isTypedEvent(l) })
			want := []string{"rebalance billing map[] -> map[b1:[0]]", "retry billing@0 attempt 1", "dead letter billing@0 attempts 2"}
			if !slices.Equal(got, want) {
				c.Errorf("engine events %q, want %q", got, want)
			}
		}},
		{name: "Redrive delivers a dead letter again, to its group only, attempts from 1", needs: engine.Redrive, run: func(c *conf) {
			b, topic := c.brokerTopic("orders")
			var mu sync.Mutex
			fixed := false
			billing := &callLog[string]{fail: func(pubsub.Message[string]) error {
				mu.Lock()
				defer mu.Unlock()
				if !fixed {
					return pubsub.ErrPermanent
				}
				return nil
			}}
			audit := &callLog[string]{}
			g := subscribe(c, topic, "billing", "b1", billing)
			subscribe(c, topic, "audit", "a1", audit)
			publish(c, topic, "k", "v")
			c.drain(b)
			mu.Lock()
			fixed = true
			mu.Unlock()
			n, err := g.Redrive(c.ctx(), nil)
			if err != nil || n != 1 {
				c.Fatalf("Redrive: %d, %v; want 1, nil", n, err)
			}
			c.drain(b)
			if got := attempts(billing.all()); !slices.Equal(got, []int{1, 1}) {
				c.Errorf("billing attempts %v, want [1 1]: the letter came back with attempts from 1", got)
			}
			if n := len(audit.all()); n != 1 {
				c.Errorf("audit handled %d, want 1: a redrive is the failing group's only", n)
			}
			if s := g.Stats(); s.Redriven != 1 || s.DeadLettersEvicted != 0 || len(g.DeadLetters()) != 0 {
				c.Errorf("stats %+v and %d dead letters, want 1 redriven (not evicted) and none left", s, len(g.DeadLetters()))
			}
		}},
		{name: "WithStuckAfter reports a delivery running past the threshold, once, and when it returns", needs: engine.VirtualTime | engine.StuckDetection, run: func(c *conf) {
			h := &confHooks{}
			b := c.broker(pubsub.WithHooks(h), pubsub.WithStuckAfter(time.Second))
			topic := c.topic(b, "orders")
			release := make(chan struct{})
			subscribe(c, topic, "billing", "b1", pubsub.HandlerFunc[string](func(context.Context, pubsub.Message[string]) error {
				<-release
				return nil
			}))
			publishValue(c, topic, "slow")
			time.Sleep(3 * time.Second)
			synctest.Wait()
			if got := h.with("stuck"); len(got) != 1 || got[0] != "stuck billing@0 returned=false" {
				c.Errorf("after 3s: stuck events %q, want one for billing@0", got)
			}
			if p := b.Snapshot().Topics[0].Groups[0].Partitions[0]; !p.Stuck || p.RunningFor < time.Second {
				c.Errorf("snapshot %+v, want Stuck with RunningFor at least 1s", p)
			}
			close(release)
			c.drain(b)
			time.Sleep(time.Second)
			synctest.Wait()
			if got := h.with("stuck"); len(got) != 2 || got[1] != "stuck billing@0 returned=true" {
				c.Errorf("after it returned: stuck events %q, want a second one with returned", got)
			}
		}},
		{name: "WithStuckAfter reports a stuck delivery, then its return, waiting on the events", needs: engine.StuckDetection, run: func(c *conf) {
			// The check above, on barriers instead of virtual time, so that
			// an engine that runs in real time is checked too.
			const after = 50 * time.Millisecond
			h := stuckEvents(make(chan pubsub.StuckEvent, 8))
			b := c.broker(pubsub.WithHooks(h), pubsub.WithStuckAfter(after))
			topic := c.topic(b, "orders")
			release := make(chan struct{})
			var once sync.Once
			unblock := func() { once.Do(func() { close(release) }) }
			c.Cleanup(unblock) // before the broker's Close, should the subtest fail first
			subscribe(c, topic, "billing", "b1", pubsub.HandlerFunc[string](func(context.Context, pubsub.Message[string]) error {
				<-release
				return nil
			}))
			publishValue(c, topic, "slow")
			e := h.next(c)
			if d := e.Delivery; e.Returned || d.Group != "billing" || d.Consumer != "b1" || d.Offset != 0 || e.Running < after {
				c.Errorf("first stuck event %+v, want billing's b1 at offset 0, running at least %v", e, after)
			}
			if p := b.Snapshot().Topics[0].Groups[0].Partitions[0]; !p.Stuck || p.RunningFor < after {
				c.Errorf("snapshot %+v, want Stuck with RunningFor at least %v", p, after)
			}
			unblock()
			// A second report of the same delivery would come before this.
			if e := h.next(c); !e.Returned || e.Delivery.Offset != 0 {
				c.Errorf("event after the handler returned: %+v, want Returned for offset 0", e)
			}
		}},
	}
}

// stuckEvents hands the stuck events to the subtest.
type stuckEvents chan pubsub.StuckEvent

func (h stuckEvents) OnStuck(e pubsub.StuckEvent) { h <- e }

// next returns the next event, failing the subtest after failureBound.
func (h stuckEvents) next(c *conf) pubsub.StuckEvent {
	c.Helper()
	select {
	case e := <-h:
		return e
	case <-c.ctx().Done():
		c.Fatalf("no stuck event within %v", failureBound)
		return pubsub.StuckEvent{}
	}
}

// with returns the lines that start with prefix.
func (h *confHooks) with(prefix string) []string {
	var out []string
	for _, l := range h.all() {
		if strings.HasPrefix(l, prefix) {
			out = append(out, l)
		}
	}
	return out
}

func (h *confHooks) OnStuck(e pubsub.StuckEvent) {
	h.add("stuck %s@%d returned=%t", e.Delivery.Group, e.Delivery.Offset, e.Returned)
}

// confHooks writes down the events of the hooks the suite checks.
type confHooks struct {
	mu    sync.Mutex
	lines []string
}

func (h *confHooks) add(format string, args ...any) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.lines = append(h.lines, fmt.Sprintf(format, args...))
}

func (h *confHooks) all() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return slices.Clone(h.lines)
}

func (h *confHooks) OnPublish(ctx context.Context, p *pubsub.PublishInfo) context.Context {
	h.add("publish %s/%d %s", p.Topic, p.Partition, p.Key)
	if p.Headers == nil {
		p.Headers = map[string]string{}
	}
	p.Headers["hooked"] = "yes"
	return ctx
}

func (h *confHooks) OnPublished(_ context.Context, p *pubsub.PublishInfo, pos pubsub.Position, err error) {
	h.add("published %s/%d@%d%s", p.Topic, pos.Partition, pos.Offset, errSuffix(err))
}

func (h *confHooks) OnDeliver(ctx context.Context, d *pubsub.DeliveryInfo) context.Context {
	h.add("deliver %s@%d attempt %d", d.Group, d.Offset, d.Attempt)
	return ctx
}

func (h *confHooks) OnDelivered(_ context.Context, d *pubsub.DeliveryInfo, r pubsub.DeliveryResult) {
	h.add("delivered %s@%d %v", d.Group, d.Offset, r.Outcome)
}

func (h *confHooks) OnRetry(e pubsub.RetryEvent) {
	h.add("retry %s@%d attempt %d", e.Delivery.Group, e.Delivery.Offset, e.Delivery.Attempt)
}

func (h *confHooks) OnDeadLetter(e pubsub.DeadLetterEvent) {
	h.add("dead letter %s@%d attempts %d", e.Delivery.Group, e.Delivery.Offset, e.Delivery.Attempt)
}

func (h *confHooks) OnRebalance(e pubsub.RebalanceEvent) {
	h.add("rebalance %s %v -> %v", e.Group, e.Before, e.After)
}

func errSuffix(err error) string {
	if err != nil {
		return " " + err.Error()
	}
	return ""
}

// isTypedEvent reports whether an event is one the typed layer raises for
// every engine.
func isTypedEvent(l string) bool {
	for _, p := range []string{"publish", "deliver"} {
		if len(l) >= len(p) && l[:len(p)] == p {
			return true
		}
	}
	return false
}

// sameEvents reports whether got has want's publish events in order and
// its delivery events in order: deliveries may begin before a later
// record is published.
func sameEvents(got, want []string) bool {
	pick := func(s []string, prefix string) []string {
		var out []string
		for _, l := range s {
			if len(l) >= len(prefix) && l[:len(prefix)] == prefix {
				out = append(out, l)
			}
		}
		return out
	}
	return len(got) == len(want) && slices.Equal(pick(got, "publish"), pick(want, "publish")) &&
		slices.Equal(pick(got, "deliver"), pick(want, "deliver"))
}
