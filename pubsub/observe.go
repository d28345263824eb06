package pubsub

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"reflect"
	"runtime/debug"
	"strconv"
	"sync"
	"time"

	"github.com/logbus/logbus/engine"
	"github.com/logbus/logbus/internal/kit"
)

// observer is what watches a broker: its hooks, sorted by kind once when
// the broker is built, its logger and its stuck threshold. A Broker that
// nothing observes has none, so the hot paths pay one nil check; one with
// hooks of some kinds only pays, on the other paths, a check of a bool.
type observer struct {
	stuck time.Duration
	log   *slog.Logger // nil: nothing is logged

	// What the typed layer must wrap, derived from the hooks table:
	// publishes when a hook of the publish path exists, deliveries when
	// one of the delivery path or a logger (for panics) does; timed when
	// some hook wants durations. engine: the engine is given the observer
	// (a hook of an engine event, or a logger).
	publishes, delivers, timed, engine bool

	// One list per Hook interface, each in the order given to WithHooks.
	// slots is the table that fills them.
	publish      []HookPublish
	published    []HookPublished
	deliver      []HookDeliver
	delivered    []HookDelivered
	retry        []HookRetry
	deadLetter   []HookDeadLetter
	rebalance    []HookRebalance
	backpressure []HookBackpressure
	drop         []HookDrop
	expire       []HookExpire
	skip         []HookSkip
	stuckHooks   []HookStuck
	membership   []HookMembership
	close        []HookClose
	newBroker    []HookNewBroker

	warns limiter // rate-limits the Warn records that can flood
}

// raisedBy says where the events of a Hook interface are raised, and so
// which path must be wrapped (or the engine told) when one is hooked.
type raisedBy uint8

const (
	byBroker   raisedBy = iota // NewBroker and Close raise them: nothing to wrap
	byPublish                  // the typed layer's publish path, wrapped when hooked
	byDelivery                 // the typed layer's delivery path, wrapped when hooked
	byEngine                   // the engine, through Observe, given the observer when hooked
)

// hookSlot is one Hook interface in the table: how a hook joins its list,
// and where its events are raised.
type hookSlot struct {
	iface reflect.Type // the Hook interface, for the tests
	by    raisedBy
	add   func(h Hook) bool // appends h to the list when it implements the interface
	used  func() bool       // whether the list holds a hook
}

// slot is the hookSlot of the Hook interface H, whose hooks list holds.
func slot[H any](list *[]H, by raisedBy) hookSlot {
	return hookSlot{
		iface: reflect.TypeFor[H](),
		by:    by,
		add: func(h Hook) bool {
			x, ok := h.(H)
			if ok {
				*list = append(*list, x)
			}
			return ok
		},
		used: func() bool { return len(*list) > 0 },
	}
}

// slots is the table of every Hook interface, each with o's list for it:
// adding a Hook interface is adding its line here (and a list above, and
// the call that raises it). The tests check that the table covers every
// Hook interface hooks.go declares, that each place raises exactly the
// hooks its lines name, and that one scenario raises them all.
func (o *observer) slots() []hookSlot {
	return []hookSlot{
		slot(&o.newBroker, byBroker),
		slot(&o.publish, byPublish),
		slot(&o.published, byPublish),
		slot(&o.deliver, byDelivery),
		slot(&o.delivered, byDelivery),
		slot(&o.retry, byEngine),
		slot(&o.deadLetter, byEngine),
		slot(&o.rebalance, byEngine),
		slot(&o.backpressure, byEngine),
		slot(&o.drop, byEngine),
		slot(&o.expire, byEngine),
		slot(&o.skip, byEngine),
		slot(&o.stuckHooks, byEngine),
		slot(&o.membership, byEngine),
		slot(&o.close, byBroker),
	}
}

// newObserver sorts hooks by kind. It returns nil when nothing observes,
// and an error wrapping ErrInvalid for a hook that implements no Hook
// interface.
func newObserver(hooks []Hook, log *slog.Logger, stuck time.Duration) (*observer, error) {
	if len(hooks) == 0 && log == nil && stuck == 0 {
		return nil, nil
	}
	o := &observer{stuck: stuck, log: log}
	slots := o.slots()
	for i, h := range hooks {
		known := false
		for _, s := range slots {
			known = s.add(h) || known
		}
		if !known {
			return nil, fmt.Errorf("%w: WithHooks: hook %d (%T) implements no Hook interface", ErrInvalid, i, h)
		}
	}
	for _, s := range slots {
		if s.used() {
			o.publishes = o.publishes || s.by == byPublish
			o.delivers = o.delivers || s.by == byDelivery
			o.engine = o.engine || s.by == byEngine
		}
	}
	o.delivers = o.delivers || log != nil
	o.engine = o.engine || log != nil
	o.timed = len(o.delivered) > 0
	return o, nil
}

// engineObserver is what the engine is given: the observer when something
// listens to the engine's events, else nil, so the engine pays nothing.
func (o *observer) engineObserver() engine.Observer {
	if o == nil || !o.engine {
		return nil
	}
	return o
}

// stuckAfter is the WithStuckAfter threshold, 0 when off.
func (o *observer) stuckAfter() time.Duration {
	if o == nil {
		return 0
	}
	return o.stuck
}

// trimmed logs a drop or an expiry, e, as msg, and raises it to hooks
// (event names them, as safely does) with on.
func trimmed[H any](o *observer, ctx context.Context, e *engine.Event, msg, event string, hooks []H, on func(H, TrimEvent)) {
	ev := TrimEvent{Topic: e.Topic, Partition: e.Partition, Count: e.Count}
	o.logAttrs(ctx, slog.LevelDebug, msg, append(topicAttrs(e.Topic, e.Partition), slog.Int64("count", e.Count))...)
	for _, h := range hooks {
		o.safely(h, event, func() { on(h, ev) })
	}
}

// safely calls f, recovering a panic of the hook it calls: logged, and
// otherwise ignored, so a broken hook breaks neither the event nor the
// other hooks.
func (o *observer) safely(hook any, event string, f func()) {
	defer func() {
		if v := recover(); v != nil {
			o.logAttrs(context.Background(), slog.LevelError, "logbus: hook panicked",
				slog.String("hook", fmt.Sprintf("%T", hook)), slog.String("event", event),
				slog.Any("panic", v), slog.String("stack", string(debug.Stack())))
		}
	}()
	f()
}

// logAttrs logs when a logger is set and enabled for level.
func (o *observer) logAttrs(ctx context.Context, level slog.Level, msg string, attrs ...slog.Attr) {
	if o.log == nil || !o.log.Enabled(ctx, level) {
		return
	}
	o.log.LogAttrs(ctx, level, msg, attrs...)
}

// enabled reports whether a record at level would be logged.
func (o *observer) enabled(level slog.Level) bool {
	return o != nil && o.log != nil && o.log.Enabled(context.Background(), level)
}

// The attribute keys: OpenTelemetry's messaging conventions where they
// have one.
const (
	attrTopic     = "messaging.destination.name"
	attrGroup     = "messaging.consumer.group.name"
	attrPartition = "messaging.destination.partition.id"
	attrID        = "messaging.message.id"
)

func topicAttrs(topic string, partition int) []slog.Attr {
	return []slog.Attr{slog.String(attrTopic, topic), slog.String(attrPartition, strconv.Itoa(partition))}
}

func deliveryAttrs(d *DeliveryInfo) []slog.Attr {
	attrs := []slog.Attr{slog.String(attrTopic, d.Topic), slog.String(attrGroup, d.Group),
		slog.String(attrPartition, strconv.Itoa(d.Partition)), slog.Int64("offset", d.Offset)}
	if d.ID != "" {
		attrs = append(attrs, slog.String(attrID, d.ID))
	}
	if d.Consumer != "" {
		attrs = append(attrs, slog.String("consumer", d.Consumer))
	}
	return append(attrs, slog.Int("attempt", d.Attempt))
}

// ---- the typed layer's events ----

// onPublish runs the HookPublish hooks, each with the context the one
// before returned.
func (o *observer) onPublish(ctx context.Context, p *PublishInfo) context.Context {
	for _, h := range o.publish {
		o.safely(h, "publish", func() {
			if c := h.OnPublish(ctx, p); c != nil {
				ctx = c
			}
		})
	}
	return ctx
}

func (o *observer) onPublished(ctx context.Context, p *PublishInfo, pos Position, err error) {
	for _, h := range o.published {
		o.safely(h, "published", func() { h.OnPublished(ctx, p, pos, err) })
	}
}

// wrapDelivery returns next raising the delivery hooks around each call,
// and logging a handler's panic, for a consumer of group.
func (o *observer) wrapDelivery(group, consumer string, next engine.Handler) engine.Handler {
	if len(o.deliver)+len(o.delivered) == 0 {
		// A logger alone: only a panic needs looking at, so the delivery
		// is described only then.
		return func(ctx context.Context, d *engine.Delivery) error {
			err := kit.Call(ctx, next, d) // a panic becomes the PanicError the engine would make, for the hooks
			if pe, ok := err.(*engine.PanicError); ok {
				o.logPanic(ctx, describe(d, group, consumer), pe)
			}
			return err
		}
	}
	return func(ctx context.Context, d *engine.Delivery) error {
		info := describe(d, group, consumer)
		for _, h := range o.deliver {
			o.safely(h, "deliver", func() {
				if c := h.OnDeliver(ctx, &info); c != nil {
					ctx = c
				}
			})
		}
		var start time.Time
		if o.timed {
			start = time.Now()
		}
		err := kit.Call(ctx, next, d) // a panic becomes the PanicError the engine would make, for the hooks
		r := DeliveryResult{Err: publicErr(err)}
		if o.timed {
			r.Took = time.Since(start)
		}
		r.Outcome, r.Err = outcomeOf(err)
		if pe, ok := err.(*engine.PanicError); ok {
			o.logPanic(ctx, info, pe)
		}
		for _, h := range o.delivered {
			o.safely(h, "delivered", func() { h.OnDelivered(ctx, &info, r) })
		}
		return err
	}
}

// outcomeOf is the Outcome of an attempt that ended with err, and the error
// the hooks see.
func outcomeOf(err error) (Outcome, error) {
	switch _, undecodable := errors.AsType[*engine.DecodeError](err); {
	case err == nil:
		return OutcomeAcked, nil
	case errors.Is(err, engine.ErrAbandoned):
		return OutcomeGivenBack, nil
	case undecodable:
		return OutcomeUndecodable, publicErr(err)
	}
	return OutcomeFailed, publicErr(err)
}

// wrapBatch is wrapDelivery for a batch consumer. Each record of a batch
// is a delivery to the hooks: all of them begin before the handler is
// called and end after it returns. With a *BatchError, the records before
// its Index are acked, the one at it ends as its Err says, and the ones
// after it are given back (they come again); with any other error the
// first record fails and the others are given back.
func (o *observer) wrapBatch(group, consumer string, next engine.BatchHandler) engine.BatchHandler {
	return func(ctx context.Context, b *engine.Batch) error {
		infos := make([]DeliveryInfo, len(b.Records))
		for i, rec := range b.Records {
			infos[i] = DeliveryInfo{Topic: b.Topic, Group: group, Consumer: consumer, Partition: b.Partition,
				Offset: rec.Offset, ID: b.IDs[i], Attempt: b.Attempt, Created: rec.Created, Key: rec.Key, Headers: rec.Headers}
			for _, h := range o.deliver {
				o.safely(h, "deliver", func() {
					if c := h.OnDeliver(ctx, &infos[i]); c != nil {
						ctx = c
					}
				})
			}
		}
		var start time.Time
		if o.timed {
			start = time.Now()
		}
		err := kit.Call(ctx, next, b)
		var took time.Duration
		if o.timed {
			took = time.Since(start)
		}
		done, failed := kit.Outcome(err, len(infos)) // as the engine reads it
		if pe, ok := failed.(*engine.PanicError); ok {
			o.logPanic(ctx, infos[done], pe)
		}
		for i := range infos {
			r := DeliveryResult{Took: took, Outcome: OutcomeAcked}
			switch {
			case i == done:
				r.Outcome, r.Err = outcomeOf(failed)
			case i > done:
				r.Outcome = OutcomeGivenBack
			}
			for _, h := range o.delivered {
				o.safely(h, "delivered", func() { h.OnDelivered(ctx, &infos[i], r) })
			}
		}
		return err
	}
}

// describe is the DeliveryInfo of d to a consumer of group.
func describe(d *engine.Delivery, group, consumer string) DeliveryInfo {
	return DeliveryInfo{Topic: d.Topic, Group: group, Consumer: consumer, Partition: d.Partition,
		Offset: d.Record.Offset, ID: d.ID, Attempt: d.Attempt, Created: d.Record.Created,
		Key: d.Record.Key, Headers: d.Record.Headers}
}

// logPanic logs a handler's recovered panic at Error, with its stack.
// A handler that panics on every record would flood the log, so this too
// is let through once a second per group and partition.
func (o *observer) logPanic(ctx context.Context, d DeliveryInfo, pe *engine.PanicError) {
	if !o.enabled(slog.LevelError) {
		return
	}
	if ok, left := o.warns.allow("panic", d.Topic, d.Group, d.Partition); ok {
		o.logAttrs(ctx, slog.LevelError, "logbus: handler panicked",
			append(deliveryAttrs(&d), slog.Any("panic", pe.Value), slog.String("stack", string(pe.Stack)),
				slog.Int64("not_logged", left))...)
	}
}

// publicErr turns the engine's error types into pubsub's.
func publicErr(err error) error {
	switch e := err.(type) {
	case *engine.PanicError:
		return &PanicError{Value: e.Value, Stack: e.Stack}
	case *engine.DecodeError:
		return &DecodeError{Topic: e.Topic, Partition: e.Partition, Offset: e.Offset, Err: e.Err}
	}
	return err
}

// onClose logs and raises the end of the first Close.
func (o *observer) onClose(took time.Duration, err error) {
	if err == nil {
		o.logAttrs(context.Background(), slog.LevelInfo, "logbus: broker closed", slog.Duration("took", took))
	} else if o.enabled(slog.LevelError) {
		o.logAttrs(context.Background(), slog.LevelError, "logbus: close left records behind",
			slog.Duration("took", took), slog.String("error", err.Error()))
		if se, ok := errors.AsType[*ShutdownError](err); ok {
			for _, u := range se.Unfinished {
				o.logAttrs(context.Background(), slog.LevelWarn, "logbus: partition left unfinished",
					slog.String(attrTopic, u.Topic), slog.String(attrGroup, u.Group),
					slog.String(attrPartition, strconv.Itoa(u.Partition)), slog.Int64("committed", u.Committed),
					slog.Int64("end", u.End), slog.Bool("running", u.Running))
			}
		}
	}
	e := CloseEvent{Took: took, Err: err}
	for _, h := range o.close {
		o.safely(h, "close", func() { h.OnClose(e) })
	}
}

// operator logs an operator's action on a group (on a topic when group
// is "") at Info.
func (o *observer) operator(action, topic, group string, err error, attrs ...slog.Attr) {
	if !o.enabled(slog.LevelInfo) {
		return
	}
	head := []slog.Attr{slog.String(attrTopic, topic)}
	if group != "" {
		head = append(head, slog.String(attrGroup, group))
	}
	attrs = append(head, attrs...)
	if err != nil {
		attrs = append(attrs, slog.String("error", err.Error()))
	}
	o.logAttrs(context.Background(), slog.LevelInfo, "logbus: "+action, attrs...)
}

// ---- the engine's events ----

// Observe is the engine's report of an event (engine.Observer): logged,
// then handed to the hooks of its kind.
func (o *observer) Observe(e *engine.Event) {
	ctx := context.Background()
	switch e.Kind {
	case engine.EventRetry:
		ev := RetryEvent{Delivery: eventDelivery(e), Delay: e.Delay, Err: publicErr(e.Err)}
		if o.enabled(slog.LevelDebug) {
			o.logAttrs(ctx, slog.LevelDebug, "logbus: delivery failed, retrying",
				append(deliveryAttrs(&ev.Delivery), slog.Duration("delay", e.Delay), errAttr(ev.Err))...)
		}
		for _, h := range o.retry {
			o.safely(h, "retry", func() { h.OnRetry(ev) })
		}
	case engine.EventDeadLetter:
		ev := DeadLetterEvent{Delivery: eventDelivery(e), Err: publicErr(e.Err), Evicted: e.Count > 0}
		if o.enabled(slog.LevelWarn) {
			if ok, left := o.warns.allow("dead letter", e.Topic, e.Group, e.Partition); ok {
				o.logAttrs(ctx, slog.LevelWarn, "logbus: dead-lettered",
					append(deliveryAttrs(&ev.Delivery), errAttr(ev.Err), slog.String("kind", engine.DeadLetterKind(e.Err)),
						slog.Bool("evicted_oldest", ev.Evicted), slog.Int64("not_logged", left))...)
			}
		}
		for _, h := range o.deadLetter {
			o.safely(h, "dead letter", func() { h.OnDeadLetter(ev) })
		}
	case engine.EventRebalance:
		ev := RebalanceEvent{Topic: e.Topic, Group: e.Group, Before: e.Before, After: e.After}
		o.logAttrs(ctx, slog.LevelInfo, "logbus: rebalanced", slog.String(attrTopic, e.Topic),
			slog.String(attrGroup, e.Group), slog.Any("before", e.Before), slog.Any("after", e.After))
		for _, h := range o.rebalance {
			o.safely(h, "rebalance", func() { h.OnRebalance(ev) })
		}
	case engine.EventBackpressureWait, engine.EventBackpressureTimeout:
		ev := BackpressureEvent{Topic: e.Topic, Partition: e.Partition, Waited: e.Delay, Err: e.Err}
		switch {
		case e.Err == nil:
			o.logAttrs(ctx, slog.LevelDebug, "logbus: partition full, publish waiting", topicAttrs(e.Topic, e.Partition)...)
		case o.enabled(slog.LevelWarn):
			if ok, left := o.warns.allow("backpressure", e.Topic, "", e.Partition); ok {
				o.logAttrs(ctx, slog.LevelWarn, "logbus: publish gave up on a full partition",
					append(topicAttrs(e.Topic, e.Partition), slog.Duration("waited", e.Delay), errAttr(e.Err),
						slog.Int64("not_logged", left))...)
			}
		}
		for _, h := range o.backpressure {
			o.safely(h, "backpressure", func() { h.OnBackpressure(ev) })
		}
	case engine.EventDrop:
		trimmed(o, ctx, e, "logbus: dropped records to make room", "drop", o.drop, HookDrop.OnDrop)
	case engine.EventExpire:
		trimmed(o, ctx, e, "logbus: expired records", "expire", o.expire, HookExpire.OnExpire)
	case engine.EventSkip:
		ev := SkipEvent{Topic: e.Topic, Group: e.Group, Partition: e.Partition, From: e.Offset, To: e.To}
		if o.enabled(slog.LevelWarn) {
			if ok, left := o.warns.allow("skip", e.Topic, e.Group, e.Partition); ok {
				o.logAttrs(ctx, slog.LevelWarn, "logbus: skipped records trimmed before the group read them",
					append(topicAttrs(e.Topic, e.Partition), slog.String(attrGroup, e.Group),
						slog.Int64("from", e.Offset), slog.Int64("to", e.To), slog.Int64("not_logged", left))...)
			}
		}
		for _, h := range o.skip {
			o.safely(h, "skip", func() { h.OnSkip(ev) })
		}
	case engine.EventMembership:
		ev := MembershipEvent{Topic: e.Topic, Group: e.Group, Err: publicErr(e.Err), Lasted: e.Delay}
		attrs := []slog.Attr{slog.String(attrTopic, e.Topic), slog.String(attrGroup, e.Group)}
		if ev.Err != nil {
			o.logAttrs(ctx, slog.LevelWarn, "logbus: cannot follow the group's membership", append(attrs, errAttr(ev.Err))...)
		} else {
			o.logAttrs(ctx, slog.LevelInfo, "logbus: group membership restored", append(attrs, slog.Duration("after", e.Delay))...)
		}
		for _, h := range o.membership {
			o.safely(h, "membership", func() { h.OnMembership(ev) })
		}
	case engine.EventStuck, engine.EventUnstuck:
		ev := StuckEvent{Delivery: eventDelivery(e), Running: e.Delay, Returned: e.Kind == engine.EventUnstuck}
		if ev.Returned {
			o.logAttrs(ctx, slog.LevelInfo, "logbus: stuck handler returned",
				append(deliveryAttrs(&ev.Delivery), slog.Duration("ran", e.Delay))...)
		} else {
			o.logAttrs(ctx, slog.LevelWarn, "logbus: handler stuck",
				append(deliveryAttrs(&ev.Delivery), slog.Duration("running", e.Delay))...)
		}
		for _, h := range o.stuckHooks {
			o.safely(h, "stuck", func() { h.OnStuck(ev) })
		}
	}
}

// eventDelivery is the delivery an engine event concerns.
func eventDelivery(e *engine.Event) DeliveryInfo {
	d := DeliveryInfo{Topic: e.Topic, Group: e.Group, Consumer: e.Consumer, Partition: e.Partition,
		Offset: e.Offset, ID: e.ID, Attempt: e.Attempt}
	rec := e.Record
	if e.Letter != nil {
		rec = e.Letter.Record
	}
	if rec != nil {
		d.Created, d.Key, d.Headers = rec.Created, rec.Key, rec.Headers
	}
	return d
}

func errAttr(err error) slog.Attr {
	if err == nil {
		return slog.String("error", "")
	}
	return slog.String("error", err.Error())
}

// limiter lets a Warn record through at most once per second per key, and
// counts what it held back, so a flood of one event is one line a second.
type limiter struct {
	mu   sync.Mutex
	last map[limitKey]*limitState
}

type limitKey struct {
	event, topic, group string
	partition           int
}

type limitState struct {
	at   time.Time
	left int64
}

// warnEvery is how often a rate-limited Warn record is let through per key.
const warnEvery = time.Second

// allow reports whether to log the event now, and how many of its kind
// were held back since the last one logged.
func (l *limiter) allow(event, topic, group string, partition int) (bool, int64) {
	now := time.Now()
	k := limitKey{event, topic, group, partition}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.last == nil {
		l.last = make(map[limitKey]*limitState)
	}
	s := l.last[k]
	if s == nil {
		l.last[k] = &limitState{at: now}
		return true, 0
	}
	if now.Sub(s.at) < warnEvery {
		s.left++
		return false, 0
	}
	left := s.left
	s.at, s.left = now, 0
	return true, left
}
