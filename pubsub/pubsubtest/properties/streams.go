package properties

import (
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing/synctest"
	"time"

	"pgregory.net/rapid"

	"github.com/logbus/logbus/pubsub"
)

// drawStream draws one of the streams that ok accepts.
func (m *machine) drawStream(t *rapid.T, ok func(*streamModel) bool) *streamModel {
	var candidates []*streamModel
	for _, st := range m.streams {
		if ok(st) {
			candidates = append(candidates, st)
		}
	}
	if len(candidates) == 0 {
		t.Skip("no such stream")
	}
	return candidates[rapid.IntRange(0, len(candidates)-1).Draw(t, "stream")]
}

// held returns the deliveries the test holds, of group or, for "", of
// every group, in the order the streams opened.
func (m *machine) held(group string) []*delivery {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []*delivery
	for _, st := range m.streams {
		if group == "" || st.group == group {
			out = append(out, st.held...)
		}
	}
	return out
}

func (m *machine) heldBy(st *streamModel) []*delivery {
	m.mu.Lock()
	defer m.mu.Unlock()
	return slices.Clone(st.held)
}

func (m *machine) heldOn(group string, p int) bool {
	return slices.ContainsFunc(m.held(group), func(d *delivery) bool { return d.d.Partition == p })
}

// settlement is what the test does with a delivery it received.
type settlement int

const (
	hold settlement = iota
	settleAck
	settleNack          // a transient *nackError
	settleNackPermanent // a *nackError wrapping ErrPermanent
	settleNackNil       // Nack(nil)
)

func (m *machine) drawSettlement(t *rapid.T, mayHold bool) settlement {
	choices := []settlement{settleAck, settleAck, settleNack, settleNackPermanent, settleNackNil}
	if mayHold {
		choices = append([]settlement{hold, hold, hold}, choices...)
	}
	return rapid.SampledFrom(choices).Draw(t, "settle")
}

// Receive takes what the streams offer now, without blocking: from each
// open stream in turn, starting at a drawn one, up to three deliveries,
// each held or settled at once (a settled one lets the next of its
// partition come). A stream offers a delivery, nothing, or, once it left
// its group and its last delivery ended, a closed channel. A stream that
// left must never receive anything.
func (m *machine) Receive(t *rapid.T) {
	var open []*streamModel
	for _, st := range m.streams {
		if !st.closed {
			open = append(open, st)
		}
	}
	if len(open) == 0 {
		t.Skip("no open stream")
	}
	first := rapid.IntRange(0, len(open)-1).Draw(t, "stream")
	received := 0
	for i := range open {
		st := open[(first+i)%len(open)]
		for received < 3 && m.receiveFrom(t, st) {
			received++
		}
	}
}

// receiveFrom takes what st offers now, and reports whether it was a
// delivery.
func (m *machine) receiveFrom(t *rapid.T, st *streamModel) bool {
	synctest.Wait() // every delivery on its way waits on the channel
	select {
	case d, ok := <-st.s.C():
		if !ok {
			switch {
			case !st.left:
				t.Fatalf("streams: C of %s/%s closed while it is a member", st.group, st.consumer)
			case len(m.heldBy(st)) > 0:
				t.Fatalf("streams: C of %s/%s closed while deliveries it received are held", st.group, st.consumer)
			}
			return false
		}
		h := m.receive(st, d)
		if how := m.drawSettlement(t, true); how != hold {
			m.settle(h, how)
		}
		return true
	default:
		if st.left && len(m.heldBy(st)) == 0 {
			t.Fatalf("streams: C of %s/%s still open after it left the group and its deliveries ended", st.group, st.consumer)
		}
		return false
	}
}

// Settle acks or nacks a held delivery; or, now and then, one settled or
// given back already, which must change nothing (every invariant would
// see a commit, a retry or a dead letter).
func (m *machine) Settle(t *rapid.T) {
	live := m.held("")
	m.mu.Lock()
	spent := slices.Clone(m.spent)
	m.mu.Unlock()
	if len(live) == 0 && len(spent) == 0 {
		t.Skip("nothing received")
	}
	if len(live) > 0 && (len(spent) == 0 || rapid.IntRange(0, 3).Draw(t, "again") > 0) {
		m.settle(live[rapid.IntRange(0, len(live)-1).Draw(t, "delivery")], m.drawSettlement(t, false))
		return
	}
	d := spent[rapid.IntRange(0, len(spent)-1).Draw(t, "spent")]
	if rapid.Bool().Draw(t, "ackAgain") {
		d.Ack()
	} else {
		d.Nack(&nackError{seq: d.Value.Seq, attempt: d.Attempt, permanent: true})
	}
}

// CloseStream closes a stream: its held deliveries are given back, to be
// delivered again with the attempt count going on; what it settled
// stands. Sometimes it first settles one delivery and closes at once, so
// that Close races the worker: a held delivery, whose worker waits for the
// outcome already; or one received just now, whose worker may still be on
// its way from handing it over to waiting for the outcome as Close lands.
// Either way the outcome must win.
func (m *machine) CloseStream(t *rapid.T) {
	st := m.drawStream(t, func(st *streamModel) bool { return !st.closed })
	before := rapid.SampledFrom([]string{"nothing", "settle held", "receive and settle"}).Draw(t, "beforeClose")
	held := m.heldBy(st)
	if before == "nothing" && len(held) == 0 && rapid.IntRange(0, 2).Draw(t, "closeIdle") > 0 {
		t.Skip("mostly, keep a stream that holds nothing open") // so that streams live long enough to hold things
	}
	switch {
	case before == "settle held" && len(held) > 0:
		m.settle(held[rapid.IntRange(0, len(held)-1).Draw(t, "delivery")], m.drawSettlement(t, false))
	case before == "receive and settle" && !st.left:
		select { // no synctest.Wait: the last Check waited
		case d, ok := <-st.s.C():
			if !ok {
				t.Fatalf("streams: C of %s/%s closed while it is a member", st.group, st.consumer)
			}
			m.settle(m.receive(st, d), m.drawSettlement(t, false))
		default:
		}
	}
	m.giveBack(st)
	err := st.s.Close()
	wasMember := !st.left
	st.closed, st.left = true, true
	switch {
	case wasMember && err != nil:
		t.Fatalf("Stream.Close of %s/%s: %v", st.group, st.consumer, err)
	case !wasMember && err != nil && !errors.Is(err, pubsub.ErrSubscription):
		t.Fatalf("Stream.Close of %s/%s, which had left: %v", st.group, st.consumer, err)
	}
	if wasMember {
		m.members[st.group] = slices.DeleteFunc(m.members[st.group], func(c string) bool { return c == st.consumer })
		select { // closed when Close returns
		case d, ok := <-st.s.C():
			if ok {
				t.Fatalf("streams: C of %s/%s delivered p%d@%d after Close", st.group, st.consumer, d.Partition, d.Offset)
			}
		default:
			t.Fatalf("streams: C of %s/%s open after Close returned", st.group, st.consumer)
		}
	}
	m.checkAssignment(t, st.group)
}

// pump consumes every member stream as a handler would, acting out the
// fault each record carries, until the function it returns is called or
// the channel closes: how Drain and Close can finish with streams in the
// groups.
func (m *machine) pump() (stop func()) {
	done := make(chan struct{})
	var wg sync.WaitGroup
	for _, st := range m.streams {
		if st.left {
			continue
		}
		wg.Go(func() { // exits when stop is called or C closes
			for {
				select {
				case <-done:
					return
				default:
				}
				select {
				case d, ok := <-st.s.C():
					if !ok {
						return
					}
					m.actOut(st, d)
				case <-done:
					return
				}
			}
		})
	}
	var once sync.Once
	return func() { once.Do(func() { close(done); wg.Wait() }) }
}

func (m *machine) actOut(st *streamModel, d *pubsub.Delivery[job]) {
	h := m.receive(st, d)
	how := settleAck
	switch d.Value.Fault {
	case faultTransient:
		if d.Attempt <= d.Value.K {
			how = settleNack
		}
	case faultPermanent:
		how = settleNackPermanent
	case faultPanic:
		how = settleNackNil
	}
	m.settle(h, how)
}

// receive records that st received d: a delivery begins. Only the
// partition's owner receives, and only while it is a member.
func (m *machine) receive(st *streamModel, d *pubsub.Delivery[job]) *delivery {
	owner := slices.Contains(st.g.Assignment()[st.consumer], d.Partition)
	m.mu.Lock()
	defer m.mu.Unlock()
	ep := m.beginLocked(st.group, st.consumer, true, d.Partition, d.Offset, string(d.Key))
	switch {
	case st.left:
		m.violations = append(m.violations, fmt.Sprintf(
			"streams: %s/%s received p%d@%d after it left the group", st.group, st.consumer, d.Partition, d.Offset))
	case !owner:
		m.violations = append(m.violations, fmt.Sprintf(
			"ownership: %s/%s received p%d@%d, which the assignment gives to another", st.group, st.consumer, d.Partition, d.Offset))
	case d.Value.Fault == faultUndecodable:
		m.violations = append(m.violations, fmt.Sprintf(
			"decode: seq %d reached a stream though it cannot be decoded", d.Value.Seq))
	}
	h := &delivery{st: st, d: d, epoch: ep}
	st.held = append(st.held, h)
	return h
}

// settle acks or nacks h: the delivery ends (in the model first, so that
// the next one, which the settle lets come, finds the partition free).
func (m *machine) settle(h *delivery, how settlement) {
	d := h.d
	c := call{group: h.st.group, consumer: h.st.consumer, stream: true, partition: d.Partition, offset: d.Offset,
		attempt: d.Attempt, seq: d.Value.Seq, epoch: h.epoch, created: d.Created, outcome: failed}
	var err error
	switch how {
	case settleAck:
		c.outcome = acked
	case settleNack:
		err, c.kind = &nackError{seq: d.Value.Seq, attempt: d.Attempt}, "transient"
	case settleNackPermanent:
		err, c.kind = &nackError{seq: d.Value.Seq, attempt: d.Attempt, permanent: true}, "permanent"
	case settleNackNil:
		c.kind = "nacked"
	}
	m.mu.Lock()
	c.end = time.Now()
	m.endLocked(c)
	h.st.held = slices.DeleteFunc(h.st.held, func(x *delivery) bool { return x == h })
	m.spent = append(m.spent, d)
	m.mu.Unlock()
	if how == settleAck {
		d.Ack()
	} else {
		d.Nack(err)
	}
}

// giveBack records that st's held deliveries were given back (Stream.Close,
// or Close cancelling the handlers' context): they end without a failure.
func (m *machine) giveBack(st *streamModel) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, h := range st.held {
		d := h.d
		m.endLocked(call{group: st.group, consumer: st.consumer, stream: true, partition: d.Partition, offset: d.Offset,
			attempt: d.Attempt, seq: d.Value.Seq, epoch: h.epoch, created: d.Created, outcome: givenBack, end: time.Now()})
		m.spent = append(m.spent, d)
	}
	st.held = nil
}
