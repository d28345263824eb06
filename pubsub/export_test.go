package pubsub

import (
	"context"
	"reflect"
	"sync"

	"github.com/logbus/logbus/engine"
)

// What the external tests (package pubsub_test) need of the package's
// insides, declared in a test file so it is no part of the API.

// HookInterfaces is every Hook interface in the observer's table
// (observer.slots), in its order.
func HookInterfaces() []reflect.Type {
	var o observer
	var out []reflect.Type
	for _, s := range o.slots() {
		out = append(out, s.iface)
	}
	return out
}

// HookCalls is a hook implementing every Hook interface: it counts the
// calls of each method, by the method's name, and of the kinds of event
// one method reports ("OnBackpressure wait" and "OnBackpressure timeout",
// "OnStuck returned"). The tests check it against the table with
// reflect's Implements, so a new Hook interface fails them until HookCalls
// implements it too. Safe for concurrent use.
type HookCalls struct {
	mu sync.Mutex
	n  map[string]int
}

func (h *HookCalls) called(name string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.n == nil {
		h.n = map[string]int{}
	}
	h.n[name]++
}

// Count is how many times the method called name was called.
func (h *HookCalls) Count(name string) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.n[name]
}

// Called is the names counted so far.
func (h *HookCalls) Called() map[string]int {
	h.mu.Lock()
	defer h.mu.Unlock()
	out := make(map[string]int, len(h.n))
	for k, v := range h.n {
		out[k] = v
	}
	return out
}

func (h *HookCalls) OnNewBroker(*Broker) { h.called("OnNewBroker") }

func (h *HookCalls) OnPublish(ctx context.Context, _ *PublishInfo) context.Context {
	h.called("OnPublish")
	return ctx
}

func (h *HookCalls) OnPublished(context.Context, *PublishInfo, Position, error) {
	h.called("OnPublished")
}

func (h *HookCalls) OnDeliver(ctx context.Context, _ *DeliveryInfo) context.Context {
	h.called("OnDeliver")
	return ctx
}

func (h *HookCalls) OnDelivered(context.Context, *DeliveryInfo, DeliveryResult) {
	h.called("OnDelivered")
}

func (h *HookCalls) OnRetry(RetryEvent)           { h.called("OnRetry") }
func (h *HookCalls) OnDeadLetter(DeadLetterEvent) { h.called("OnDeadLetter") }
func (h *HookCalls) OnRebalance(RebalanceEvent)   { h.called("OnRebalance") }
func (h *HookCalls) OnDrop(TrimEvent)             { h.called("OnDrop") }
func (h *HookCalls) OnExpire(TrimEvent)           { h.called("OnExpire") }
func (h *HookCalls) OnSkip(SkipEvent)             { h.called("OnSkip") }
func (h *HookCalls) OnClose(CloseEvent)           { h.called("OnClose") }
func (h *HookCalls) OnMembership(MembershipEvent) { h.called("OnMembership") }

// RaiseMembership hands b's observer an EventMembership, as an engine
// that keeps membership on a server raises it (the in-memory engine never
// does): err is the failure, nil for a recovery.
func RaiseMembership(b *Broker, topic, group string, err error) {
	if b.obs != nil {
		b.obs.Observe(&engine.Event{Kind: engine.EventMembership, Topic: topic, Group: group, Err: err})
	}
}

func (h *HookCalls) OnBackpressure(e BackpressureEvent) {
	h.called("OnBackpressure")
	if e.Err == nil {
		h.called("OnBackpressure wait")
	} else {
		h.called("OnBackpressure timeout")
	}
}

func (h *HookCalls) OnStuck(e StuckEvent) {
	h.called("OnStuck")
	if e.Returned {
		h.called("OnStuck returned")
	}
}

// FailuresKept is how many failed Pendings' errors are kept (see
// failures).
func FailuresKept() int {
	n := 0
	failures.Range(func(any, any) bool { n++; return true })
	return n
}
