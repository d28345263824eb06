package jetstream

// Redrive: dead letters sent back to their group only.
//
// Each group has a redrive stream (work-queue retention, a subject per
// partition) and, on it, a durable consumer per partition, configured as
// the group's own consumers are: explicit acks, one record in flight, the
// pinned-client priority group. Redrive copies a dead letter into its
// partition's subject, and removes it from the dead-letter stream only
// once the server stored the copy. The partition's worker (whichever
// broker owns the partition) looks at its redrive consumer before it
// pulls the next record of the partition, and delivers what it finds
// there first, through the same paths as a record (await, deliver,
// retries with NakWithDelay, dead letters), except that it commits
// nothing in the partition: an ack removes the letter from the redrive
// stream. So a redriven letter survives a restart, is fenced by the pin
// like any record (two members never both deliver it), counts its
// attempts on the server from 1, and after a crash comes back to the
// partition's next owner after AckWait, as a record in flight does.

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/logbus/logbus/engine"
	"github.com/logbus/logbus/internal/kit"
	"github.com/nats-io/nats.go"
	natsjs "github.com/nats-io/nats.go/jetstream"
)

var _ engine.Redriver = (*group)(nil)

// redrivenMsg is a record pulled from a redrive consumer: a dead letter
// on its way back, not a record of the partition's stream.
type redrivenMsg struct{ record }

func isRedriven(m record) bool {
	_, ok := m.(redrivenMsg)
	return ok
}

// openRedrive finds or creates the group's redrive stream and its
// consumers. A consumer is created only when missing: updating an
// existing one could undo another broker's Pause.
func (g *group) openRedrive(ctx context.Context) error {
	e := g.e
	var err error
	g.rdq, err = e.createStream(ctx, natsjs.StreamConfig{
		Name:      e.names.redriveStream(g.t.name, g.name),
		Subjects:  []string{e.names.redriveSubjects(g.t.name, g.name)},
		Retention: natsjs.WorkQueuePolicy,
		Storage:   g.t.streamConfig(0).Storage,
	}, true)
	if err != nil {
		return err
	}
	g.rconsumer = make([]natsjs.Consumer, g.t.parts)
	for p := range g.t.parts {
		name := e.names.redriveConsumer(p)
		c, err := g.rdq.Consumer(ctx, name)
		if errors.Is(err, natsjs.ErrConsumerNotFound) {
			c, err = g.rdq.CreateConsumer(ctx, natsjs.ConsumerConfig{
				Durable:        name,
				FilterSubject:  e.names.redriveSubject(g.t.name, g.name, p),
				AckPolicy:      natsjs.AckExplicitPolicy,
				AckWait:        e.cfg.ackWait,
				MaxDeliver:     -1,
				MaxAckPending:  1,
				DeliverPolicy:  natsjs.DeliverAllPolicy,
				PriorityGroups: []string{priorityGroup},
				PriorityPolicy: natsjs.PriorityPolicyPinned,
				PinnedTTL:      e.cfg.memberTTL,
			})
			if err != nil { // another broker created it meanwhile
				c, err = g.rdq.Consumer(ctx, name)
			}
		}
		if err != nil {
			return fmt.Errorf("partition %d: %w", p, err)
		}
		g.rconsumer[p] = c
	}
	return nil
}

// Redrive takes the dead letters match accepts (every one when match is
// nil) out of the group's dead-letter stream, oldest first, and queues
// each on its partition's redrive subject, to be delivered again to this
// group only by the partition's owner, in whichever broker (see
// engine.Redriver). A letter leaves the dead-letter stream only after the
// server stored its copy, so a failure midway loses none: Redrive then
// returns how many it queued, and the error. A letter queued by two
// concurrent Redrives (of two brokers) is stored once (the copy's message
// ID is the letter's) and counted by the first. A letter stored without
// its value (DeadLetter.Truncated) cannot be redriven: it stays, and once
// the others are queued Redrive returns their count with an error
// wrapping ErrInvalid that says how many stayed. It reads the letters by
// batches (dlq.go) and does not wait for the deliveries; Drain does. Each
// request is bounded by ctx, and by the request timeout when ctx has no
// deadline. match runs on the caller's goroutine, under no lock. After
// Close began it fails with ErrClosed.
func (g *group) Redrive(ctx context.Context, match func(*engine.DeadLetter) bool) (int, error) {
	if err := g.refuseWork("redrive"); err != nil {
		return 0, err
	}
	e := g.e
	n := 0
	touched := map[int]bool{}
	defer func() {
		g.redriven.Add(int64(n))
		if len(touched) > 0 {
			g.wakeRedrive(touched)
		}
	}()
	var info *natsjs.StreamInfo
	err := g.bounded(ctx, func(ctx context.Context) (err error) { info, err = g.dlq.Info(ctx); return err })
	if err != nil {
		return 0, e.ctxErr(ctx, fmt.Errorf("redrive: dead-letter stream: %w", err))
	}
	if info.State.Msgs == 0 {
		return 0, nil
	}
	truncated := 0
	var stepErr error
	err = g.scanLetters(ctx, info.State.FirstSeq, info.State.LastSeq, func(m *natsjs.RawStreamMsg) bool {
		l := g.letter(m)
		if l.Partition < 0 || l.Partition >= g.t.parts { // not a letter of this group's: left alone
			return true
		}
		if match != nil && !match(&l) {
			return true
		}
		if l.Truncated {
			truncated++
			return true
		}
		var queued bool
		queued, stepErr = g.redriveOne(ctx, m, &l)
		if queued {
			n++
			touched[l.Partition] = true
		}
		return stepErr == nil
	})
	switch {
	case stepErr != nil:
		return n, e.ctxErr(ctx, stepErr)
	case err != nil:
		return n, e.ctxErr(ctx, fmt.Errorf("redrive: read the dead letters: %w", err))
	case truncated > 0:
		return n, fmt.Errorf("%w: redrive: %d dead letters were stored without their values (DeadLetter.Truncated) and cannot be redriven: discard them, or publish their records again",
			engine.ErrInvalid, truncated)
	}
	return n, nil
}

// redriveOne queues the dead letter m (l as read) on its partition's
// redrive subject, then removes it from the dead-letter stream; it
// reports whether this call queued it (false when another Redrive did).
func (g *group) redriveOne(ctx context.Context, m *natsjs.RawStreamMsg, l *engine.DeadLetter) (bool, error) {
	e := g.e
	letterID := m.Header.Get(natsjs.MsgIDHeader)
	if letterID == "" {
		letterID = strconv.FormatUint(m.Sequence, 10)
	}
	rm := nats.NewMsg(e.names.redriveSubject(g.t.name, g.name, l.Partition))
	rm.Data = m.Data
	for k, v := range m.Header {
		if !strings.HasPrefix(k, "Nats-") {
			rm.Header[k] = v
		}
	}
	var ack *natsjs.PubAck
	err := g.bounded(ctx, func(ctx context.Context) (err error) {
		ack, err = e.js.PublishMsg(ctx, rm, natsjs.WithMsgID("rd-"+letterID))
		return err
	})
	if err != nil {
		return false, fmt.Errorf("redrive: queue dead letter %s: %w", l.ID, err)
	}
	queued := !ack.Duplicate // a duplicate was queued, and counted, by another Redrive
	err = g.bounded(ctx, func(ctx context.Context) error { return g.dlq.DeleteMsg(ctx, m.Sequence) })
	if err != nil && !errors.Is(err, natsjs.ErrMsgNotFound) {
		// Queued, and still a dead letter: kept in both rather than
		// lost. It is delivered again, and a later Redrive takes the
		// letter out without queueing it twice (within the server's
		// duplicate window).
		return queued, fmt.Errorf("redrive: remove dead letter %s: %w", l.ID, err)
	}
	g.forgetLetter(letterID)
	return queued, nil
}

// wakeRedrive makes the owners of partitions look at their redrive
// consumers: this broker's workers at once, other brokers' through a core
// NATS message their group loops listen to (lost if a broker is not
// connected just then: the loops also look every tick).
func (g *group) wakeRedrive(partitions map[int]bool) {
	for p := range partitions {
		g.slots[p].wantRedrive()
	}
	_ = g.e.js.Conn().Publish(g.e.names.redriveWake(g.t.name, g.name), nil)
}

// wantRedrive makes the slot's worker look at its redrive consumer before
// its next pull.
func (s *slot) wantRedrive() {
	s.mu.Lock()
	s.redriveGen++
	s.signal()
	s.mu.Unlock()
}

// wantsRedrive reports whether the worker must look at the redrive
// consumer. s.mu must be held.
func (s *slot) wantsRedrive() bool { return s.redriveGen != s.redriveSeen }

// pollRedrive flags every slot when the group's redrive stream holds
// letters: the loop's fallback for a wake-up that was lost.
func (g *group) pollRedrive() {
	ctx, cancel := g.e.ctx()
	info, err := g.rdq.Info(ctx)
	cancel()
	if err != nil || info.State.Msgs == 0 {
		return
	}
	for _, s := range g.slots {
		s.wantRedrive()
	}
}

// redriveStep delivers one redriven letter of the worker's partition, if
// there is one: one the previous local worker kept first, else the next
// from the partition's redrive consumer. When the consumer has nothing
// waiting and nothing unacked, it records that, and the worker goes on
// with the partition's records. A letter unacked elsewhere (a crashed
// member's, until AckWait, or one waiting out its backoff) keeps the
// worker here, as a record in flight would: order is kept.
func (w *worker) redriveStep() {
	s, g := w.s, w.g
	s.mu.Lock()
	if msg, ok := s.pending.(redrivenMsg); ok && !w.stopping() {
		s.pending = nil
		s.mu.Unlock()
		w.takeRedriven(msg)
		return
	}
	gen := s.redriveGen
	s.phase = fetching
	s.signal()
	s.mu.Unlock()
	defer s.setPhase(parked)
	ctx, cancel := g.e.ctx()
	info, err := g.rconsumer[s.p].Info(ctx)
	cancel()
	if err != nil {
		w.pause(g.e.cfg.pollWait)
		return
	}
	if info.NumPending == 0 && info.NumAckPending == 0 {
		s.mu.Lock()
		if s.redriveGen == gen { // no Redrive since the look
			s.redriveSeen = gen
		}
		s.mu.Unlock()
		return
	}
	p, err := w.redrivePuller()
	if err != nil {
		w.pause(g.e.cfg.pollWait)
		return
	}
	hadPin := p.pin != ""
	wait := g.e.cfg.pollWait
	if err := p.pull(wait); err != nil {
		w.pause(g.e.cfg.pollWait)
		return
	}
	msg, err := p.next(g.e.handlerCtx.Done(), wait+time.Second)
	switch {
	case msg != nil:
		w.takeRedriven(redrivenMsg{msg})
	case errors.Is(err, errPinned) && hadPin:
		// The pin lapsed while the consumer was idle (PinnedTTL): the
		// next pull, without it, gets a new one.
	case err != nil:
		w.pause(g.e.cfg.pollWait)
	}
}

// takeRedriven waits while the slot is held, then delivers msg.
func (w *worker) takeRedriven(msg redrivenMsg) {
	s := w.s
	s.mu.Lock()
	epoch := s.epoch // a reset of the partition's consumer does not concern the letter
	s.mu.Unlock()
	revoked, ok := w.await(msg, epoch)
	if !ok {
		return
	}
	if w.deliver(msg, revoked) {
		w.keepGivenBack(msg, epoch)
		return
	}
	s.setPhase(parked)
}

// redrivePuller returns the partition's redrive puller, making it on first
// use.
func (w *worker) redrivePuller() (*puller, error) {
	return w.pullerOf(&w.s.rpuller, func() (string, string) {
		return w.g.e.names.redriveStream(w.g.t.name, w.g.name), w.g.e.names.redriveConsumer(w.s.p)
	})
}

// redelivery turns a redriven letter into the delivery of its record:
// its original partition, offset, ID and creation time, with the attempt
// its redrive consumer counts (from 1).
func (w *worker) redelivery(msg redrivenMsg, md *natsjs.MsgMetadata, revoked <-chan struct{}) (*engine.Delivery, error) {
	h := msg.Headers()
	offset, _ := strconv.ParseInt(h.Get(hdrOffset), 10, 64)
	created, _ := time.Parse(time.RFC3339Nano, h.Get(hdrCreated))
	rec, err := decodeRecord(h, msg.Data(), uint64(offset)+1, created)
	if err != nil {
		rec = &engine.Record{Offset: offset, Value: msg.Data(), Created: created}
	}
	return &engine.Delivery{Topic: w.g.t.name, Partition: w.s.p, ID: h.Get(hdrID), Record: rec,
		Attempt: int(md.NumDelivered), Revoked: revoked}, err
}

// settleRedriven tells the server the outcome of a redriven letter's
// delivery, as settle does a record's, but commits nothing in the
// partition: an ack (or, once dead-lettered again, an ack too) removes
// the letter from the redrive stream.
func (w *worker) settleRedriven(msg redrivenMsg, md *natsjs.MsgMetadata, d *engine.Delivery, herr error) {
	g := w.g
	ack := func() {
		ctx, cancel := g.e.ctx()
		_ = msg.DoubleAck(ctx)
		cancel()
		g.e.committed()
	}
	switch kit.Judge(herr, d.Attempt, g.spec.Retry.MaxAttempts) {
	case kit.Abandoned, kit.NotDelivered:
		_ = msg.Nak()
	case kit.Ack:
		g.delivered.Add(1) // before the ack, which Drain may see
		ack()
	case kit.DeadLetter:
		// Its own letter ID: the redrive consumer's sequences are not the
		// partition consumer's.
		if !w.deadLetter(msg, d, herr, letterID(d, md)+"-r"+strconv.FormatUint(md.Sequence.Stream, 10)) {
			ack()
		}
	default:
		w.retry(msg, d, herr)
	}
}

// deliverLetter is deliver for a redriven letter: the partition's
// position (next, the skip count) is not its concern.
func (w *worker) deliverLetter(msg redrivenMsg, revoked <-chan struct{}) (gaveBack bool) {
	g, s := w.g, w.s
	md, err := msg.Metadata()
	if err != nil {
		_ = msg.Nak()
		return false
	}
	d, derr := w.redelivery(msg, md, revoked)
	s.mu.Lock()
	s.beginLocked(d.Record.Offset, d.Attempt, w.m.name) // not the partition's position: no skip to count
	s.mu.Unlock()
	verdict, herr := w.handle(msg, d, derr, w.callOne)
	if g.e.handlerCtx.Err() != nil {
		return false // Close gave up on this delivery: it stays queued
	}
	if verdict == kit.NotDelivered {
		return true
	}
	w.settleRedriven(msg, md, d, herr)
	return false
}

// callOne runs the member's handler on one delivery: a batch consumer's
// as a batch of one record.
func (w *worker) callOne(d *engine.Delivery) error {
	if w.m.bh == nil {
		return w.call(d)
	}
	b := &engine.Batch{Topic: d.Topic, Partition: d.Partition, Records: []*engine.Record{d.Record},
		IDs: []string{d.ID}, Attempt: d.Attempt, Revoked: d.Revoked}
	_, failed := kit.Outcome(w.callBatch(b), 1)
	return failed
}

// redriving counts, by partition, the redriven letters waiting on the
// server (delivered or not yet); nil when the server cannot be asked.
func (g *group) redriving(ctx context.Context) []int {
	info, err := g.rdq.Info(ctx, natsjs.WithSubjectFilter(g.e.names.redriveSubjects(g.t.name, g.name)))
	if err != nil {
		return nil
	}
	out := make([]int, g.t.parts)
	for subj, n := range info.State.Subjects {
		if p, err := strconv.Atoi(subj[strings.LastIndexByte(subj, '.')+1:]); err == nil && p >= 0 && p < len(out) {
			out[p] = int(n)
		}
	}
	return out
}
