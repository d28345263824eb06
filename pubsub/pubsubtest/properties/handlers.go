package properties

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/logbus/logbus/pubsub"
)

// beginLocked records that a delivery of (group, p) of the record at off,
// whose key is key, begins, and returns its epoch. No delivery of the
// partition may be in hand (invariant 4's dynamic half: one consumer at a
// time, one delivery at a time); with key concurrency n, fewer than n may,
// all of the same consumer and none of the same key. None begins while the
// group is paused: Pause returned, so the deliveries in flight then were
// the last until Resume. The caller holds m.mu.
func (m *machine) beginLocked(group, consumer string, stream bool, p int, off int64, key string) int {
	k := gp{group, p}
	n := max(1, m.keyed[group])
	for _, h := range m.busy[k] {
		switch {
		case n == 1 || h.consumer != consumer:
			m.violations = append(m.violations, fmt.Sprintf(
				"ownership: %s/%s begins p%d@%d while %s has a delivery of the partition in hand", group, consumer, p, off, h.consumer))
		case key != "" && h.key == key:
			m.violations = append(m.violations, fmt.Sprintf(
				"key concurrency: %s/%s begins p%d@%d while p%d@%d of its key %q is in hand", group, consumer, p, off, p, h.offset, key))
		}
	}
	if n > 1 && len(m.busy[k]) >= n {
		m.violations = append(m.violations, fmt.Sprintf(
			"key concurrency: %s/%s begins p%d@%d with %d deliveries of the partition in hand, WithKeyConcurrency(%d)",
			group, consumer, p, off, len(m.busy[k]), n))
	}
	m.busy[k] = append(m.busy[k], holder{consumer: consumer, stream: stream, offset: off, key: key})
	if m.paused[group] {
		m.violations = append(m.violations, fmt.Sprintf(
			"pause: %s/%s begins p%d@%d while the group is paused", group, consumer, p, off))
	}
	return m.epochIdx[k]
}

// endLocked records that a delivery ended. The caller holds m.mu.
func (m *machine) endLocked(c call) {
	m.doneLocked(gp{c.group, c.partition}, c.offset)
	m.calls = append(m.calls, c)
}

// doneLocked takes the delivery of the record at off out of k's hand.
func (m *machine) doneLocked(k gp, off int64) {
	m.busy[k] = slices.DeleteFunc(m.busy[k], func(h holder) bool { return h.offset == off })
	if len(m.busy[k]) == 0 {
		delete(m.busy, k)
	}
}

// actOut acts out the fault msg carries, for a per-record handler and for
// each message of a batch alike: it returns the call to record (its end
// not yet set) and the error the handler returns for it. A panic fault
// returns no error: the caller panics, or reports it as a batch does.
func actOut(ctx context.Context, group, consumer string, ep int, msg pubsub.Message[job]) (call, error) {
	c := call{group: group, consumer: consumer, partition: msg.Partition, offset: msg.Offset,
		attempt: msg.Attempt, seq: msg.Value.Seq, epoch: ep, created: msg.Created, outcome: failed}
	var err error
	switch msg.Value.Fault {
	case faultNone:
		c.outcome = acked
	case faultTransient:
		if msg.Attempt <= msg.Value.K {
			err, c.kind = &nackError{seq: msg.Value.Seq, attempt: msg.Attempt}, "transient"
		} else {
			c.outcome = acked
		}
	case faultPermanent:
		err, c.kind = &nackError{seq: msg.Value.Seq, attempt: msg.Attempt, permanent: true}, "permanent"
	case faultPanic:
		c.kind = "panic"
	case faultUndecodable:
		err, c.kind = fmt.Errorf("seq %d reached a handler though it cannot be decoded", msg.Value.Seq), "transient"
	}
	if c.outcome == failed && ctx.Err() != nil {
		c.outcome = cut // Close gave up: the worker drops what the handler says
	}
	return c, err
}

func (m *machine) handler(group, consumer string) pubsub.HandlerFunc[job] {
	return func(ctx context.Context, msg pubsub.Message[job]) error {
		m.mu.Lock()
		ep := m.beginLocked(group, consumer, false, msg.Partition, msg.Offset, string(msg.Key))
		m.mu.Unlock()
		if msg.Value.Sleep > 0 {
			time.Sleep(time.Duration(msg.Value.Sleep) * time.Millisecond) // virtual time; ignores ctx on purpose
		}

		c, err := actOut(ctx, group, consumer, ep, msg)
		m.mu.Lock()
		if msg.Value.Fault == faultUndecodable {
			m.violations = append(m.violations, "decode: "+err.Error())
		}
		c.end = time.Now()
		m.endLocked(c)
		m.mu.Unlock()
		if c.kind == "panic" {
			panic(fmt.Sprintf("poison seq %d", msg.Value.Seq))
		}
		return err
	}
}

// batchHandler is a batch consumer's handler. It acts out each message's
// fault in order, as handler does, and ends the batch at the first failure
// with a BatchError naming it: the messages after it are not processed, so
// they have no call. A panic fault panics when its message is the first of
// the batch (a panic fails the first message); later in a batch the
// handler reports it as a *PanicError at its index, as a handler that
// recovered it would. The delivery begins when the call does and every
// message of it ends when the call returns: the batch's commit follows
// that, once.
func (m *machine) batchHandler(group, consumer string) pubsub.BatchHandlerFunc[job] {
	return func(ctx context.Context, msgs []pubsub.Message[job]) error {
		first := msgs[0]
		m.mu.Lock()
		ep := m.beginLocked(group, consumer, false, first.Partition, first.Offset, string(first.Key))
		m.mu.Unlock()
		var calls []call
		var err error
		var undecodable []string
		panicked := false
		for i, msg := range msgs {
			if msg.Attempt != first.Attempt || msg.Offset != first.Offset+int64(i) || msg.Partition != first.Partition {
				m.mu.Lock()
				m.violations = append(m.violations, fmt.Sprintf("batch: %s/%s message %d is p%d@%d attempt %d, after p%d@%d attempt %d",
					group, consumer, i, msg.Partition, msg.Offset, msg.Attempt, first.Partition, first.Offset, first.Attempt))
				m.mu.Unlock()
			}
			if msg.Value.Sleep > 0 {
				time.Sleep(time.Duration(msg.Value.Sleep) * time.Millisecond) // virtual time; ignores ctx on purpose
			}
			c, fail := actOut(ctx, group, consumer, ep, msg)
			switch msg.Value.Fault {
			case faultPanic:
				if i == 0 {
					panicked = true
				} else {
					fail = &pubsub.PanicError{Value: fmt.Sprintf("poison seq %d", msg.Value.Seq)}
				}
			case faultUndecodable:
				undecodable = append(undecodable, "decode: "+fail.Error())
			}
			calls = append(calls, c)
			if c.outcome != acked {
				if fail != nil {
					err = &pubsub.BatchError{Index: i, Err: fail}
				}
				break
			}
		}
		end := time.Now()
		m.mu.Lock()
		m.violations = append(m.violations, undecodable...)
		m.doneLocked(gp{group, first.Partition}, first.Offset)
		for _, c := range calls {
			c.end = end
			m.calls = append(m.calls, c)
		}
		m.mu.Unlock()
		if panicked {
			panic(fmt.Sprintf("poison seq %d", first.Value.Seq))
		}
		return err
	}
}

// finalFailure reports whether c is a failed attempt after which the
// record is dead-lettered: one wrapping ErrPermanent, or one at
// MaxAttempts or beyond (an attempt given back counts, so a record can be
// tried more than MaxAttempts times; see givenBack).
func (m *machine) finalFailure(c call) bool {
	return c.outcome == failed && (c.kind == "permanent" || c.attempt >= m.maxAttempts)
}
