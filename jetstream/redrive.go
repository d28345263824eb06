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
	"github.com/nats-io/nats.go"
	natsjs "github.com/nats-io/nats.go/jetstream"
)

// redrive is a group's redrive stream and its consumers, one per
// partition. Set when the group opens, never changed after.
type redrive struct {
	g         *group
	rdq       natsjs.Stream
	consumers []natsjs.Consumer
}

// redrivenMsg is a record pulled from a redrive consumer: a dead letter
// on its way back, not a record of the partition's stream.
type redrivenMsg struct{ record }

func isRedriven(m record) bool {
	_, ok := m.(redrivenMsg)
	return ok
}

// redelivery turns a redriven letter into the delivery of its record to
// partition p of topic: its original offset, ID and creation time, with
// the attempt its redrive consumer counts (from 1). The error says the
// record could not be decoded.
func redelivery(msg redrivenMsg, md *natsjs.MsgMetadata, topic string, p int, revoked <-chan struct{}) (*engine.Delivery, error) {
	h := msg.Headers()
	offset, _ := strconv.ParseInt(h.Get(hdrOffset), 10, 64)
	created, _ := time.Parse(time.RFC3339Nano, h.Get(hdrCreated))
	rec, err := decodeOrRaw(h, msg.Data(), uint64(offset)+1, created)
	return &engine.Delivery{Topic: topic, Partition: p, ID: h.Get(hdrID), Record: rec,
		Attempt: int(md.NumDelivered), Revoked: revoked}, err
}

// openRedrive finds or creates the group's redrive stream and its
// consumers. A consumer is created only when missing: updating an
// existing one could undo another broker's Pause.
func openRedrive(ctx context.Context, g *group) (*redrive, error) {
	e := g.e
	rdq, err := g.stream(ctx, natsjs.StreamConfig{
		Name:      e.names.redriveStream(g.t.name, g.name),
		Subjects:  []string{e.names.redriveSubjects(g.t.name, g.name)},
		Retention: natsjs.WorkQueuePolicy,
	})
	if err != nil {
		return nil, err
	}
	rd := &redrive{g: g, rdq: rdq, consumers: make([]natsjs.Consumer, g.t.parts)}
	for p := range g.t.parts {
		name := e.names.redriveConsumer(p)
		c, err := rdq.Consumer(ctx, name)
		if errors.Is(err, natsjs.ErrConsumerNotFound) {
			c, err = rdq.CreateConsumer(ctx, natsjs.ConsumerConfig{
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
				c, err = rdq.Consumer(ctx, name)
			}
		}
		if err != nil {
			return nil, fmt.Errorf("partition %d: %w", p, err)
		}
		rd.consumers[p] = c
	}
	return rd, nil
}

// run takes the dead letters match accepts (every one when match is
// nil) out of the group's dead-letter stream, oldest first, and queues
// each on its partition's redrive subject, to be delivered again to this
// group only by the partition's owner, in whichever broker (see
// [engine.Redriver]). A letter leaves the dead-letter stream only after the
// server stored its copy, so a failure midway loses none: run then
// returns how many it queued, and the error. A letter queued by two
// concurrent Redrives (of two brokers) is stored once (the copy's message
// ID is the letter's) and counted by the first. A letter stored without
// its value (DeadLetter.Truncated) cannot be redriven: it stays, and once
// the others are queued run returns their count with an error
// wrapping ErrInvalid that says how many stayed. It reads the letters by
// batches (dlq.go) and does not wait for the deliveries; Drain does. Each
// request is bounded by ctx, and by the request timeout when ctx has no
// deadline. match runs on the caller's goroutine, under no lock. After
// Close began it fails with ErrClosed.
func (rd *redrive) run(ctx context.Context, match func(*engine.DeadLetter) bool) (int, error) {
	g := rd.g
	if err := g.refuseWork("redrive"); err != nil {
		return 0, err
	}
	e := g.e
	n := 0
	touched := map[int]bool{}
	defer func() {
		g.counts.redriven.Add(int64(n))
		if len(touched) > 0 {
			rd.wake(touched)
		}
	}()
	var info *natsjs.StreamInfo
	err := e.boundedDo(ctx, func(ctx context.Context) (err error) { info, err = g.letters.dlq.Info(ctx); return err })
	if err != nil {
		return 0, e.ctxErr(ctx, fmt.Errorf("redrive: dead-letter stream: %w", err))
	}
	if info.State.Msgs == 0 {
		return 0, nil
	}
	truncated := 0
	var stepErr error
	err = g.letters.scan(ctx, info.State.FirstSeq, info.State.LastSeq, func(m *natsjs.RawStreamMsg) bool {
		l := g.letters.letter(m)
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
		queued, stepErr = rd.one(ctx, m, &l)
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

// one queues the dead letter m (l as read) on its partition's redrive
// subject, then removes it from the dead-letter stream; it reports
// whether this call queued it (false when another Redrive did).
func (rd *redrive) one(ctx context.Context, m *natsjs.RawStreamMsg, l *engine.DeadLetter) (bool, error) {
	g := rd.g
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
	err := e.boundedDo(ctx, func(ctx context.Context) (err error) {
		ack, err = e.js.PublishMsg(ctx, rm, natsjs.WithMsgID("rd-"+letterID))
		return err
	})
	if err != nil {
		return false, fmt.Errorf("redrive: queue dead letter %s: %w", l.ID, err)
	}
	queued := !ack.Duplicate // a duplicate was queued, and counted, by another Redrive
	err = e.boundedDo(ctx, func(ctx context.Context) error { return g.letters.dlq.DeleteMsg(ctx, m.Sequence) })
	if err != nil && !errors.Is(err, natsjs.ErrMsgNotFound) {
		// Queued, and still a dead letter: kept in both rather than
		// lost. It is delivered again, and a later Redrive takes the
		// letter out without queueing it twice (within the server's
		// duplicate window).
		return queued, fmt.Errorf("redrive: remove dead letter %s: %w", l.ID, err)
	}
	g.letters.forget(letterID)
	return queued, nil
}

// wake makes the owners of partitions look at their redrive consumers:
// this broker's workers at once, other brokers' through a core NATS
// message their group loops listen to (lost if a broker is not connected
// just then: the loops also look every tick).
func (rd *redrive) wake(partitions map[int]bool) {
	g := rd.g
	for p := range partitions {
		g.slots[p].wantRedrive()
	}
	_ = g.e.js.Conn().Publish(g.e.names.redriveWake(g.t.name, g.name), nil)
}

// undelivered reports whether partition p's redrive subject holds a
// letter stored after the consumer's last delivery (delivered, a stream
// sequence). The consumer's count of pending letters cannot say it: the
// server updates that count after it acknowledged the letter's publish, so
// a worker woken by a Redrive that just returned can find it still 0 (and
// would pass the letter by). The subject's last letter is read from the
// stream's store, which the acknowledgement follows.
func (rd *redrive) undelivered(ctx context.Context, p int, delivered uint64) (bool, error) {
	g := rd.g
	m, err := rd.rdq.GetLastMsgForSubject(ctx, g.e.names.redriveSubject(g.t.name, g.name, p))
	if errors.Is(err, natsjs.ErrMsgNotFound) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	return m.Sequence > delivered, nil
}

// poll flags every slot when the group's redrive stream holds letters:
// the loop's fallback for a wake-up that was lost.
func (rd *redrive) poll() {
	ctx, cancel := rd.g.e.ctx()
	info, err := rd.rdq.Info(ctx)
	cancel()
	if err != nil || info.State.Msgs == 0 {
		return
	}
	for _, s := range rd.g.slots {
		s.wantRedrive()
	}
}

// waiting counts, by partition, the redriven letters waiting on the
// server (delivered or not yet); nil when the server cannot be asked.
func (rd *redrive) waiting(ctx context.Context) []int {
	g := rd.g
	info, err := rd.rdq.Info(ctx, natsjs.WithSubjectFilter(g.e.names.redriveSubjects(g.t.name, g.name)))
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
