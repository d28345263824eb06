package jetstream

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	natsjs "github.com/nats-io/nats.go/jetstream"
)

// A partition's pulls go over one subscription of its own, kept for the
// group's life in this broker: a pull request for one record at a time,
// its answer (the record, or a status when it expired or was refused) on
// a fixed inbox. nats.go's Fetch makes a subscription per pull, which cost
// more than anything else per record (bench/README.md), and a record the
// server sends to a pull whose subscription is gone counts as delivered
// and comes back only after AckWait; here no answer is ever lost while
// the group runs in this broker.
//
// While records flow, the pull for the next record rides on the ack of
// the last (ackNext, the server's "+NXT"): one message to the server and
// one back per record, as for nats.go's Consume with asynchronous acks,
// where a pull then a confirmed ack (DoubleAck) took two each way. The
// server reads the ack before the pull, so the pull's answer, a record or
// an expiry, also tells the ack was read. Why not one pull for many
// records, as Consume keeps: a pull stays open on the server while the
// handler runs, and when retention drops the record in flight (DropOldest,
// MaxAge) the server counts it settled and sends the next ones at once,
// to be handled after they too were dropped, and more than one at a time.

// record is a delivered message as the worker uses it: a natsjs.Msg, or
// a rawMsg from a puller.
type record interface {
	Metadata() (*natsjs.MsgMetadata, error)
	Headers() nats.Header
	Data() []byte
	Ack() error
	DoubleAck(ctx context.Context) error
	Nak() error
	NakWithDelay(delay time.Duration) error
	InProgress() error
	TermWithReason(reason string) error
}

// puller pulls a partition's records for the slot's current worker. Only
// that worker uses it: it is not safe for concurrent use.
type puller struct {
	nc    *nats.Conn
	subj  string // the consumer's next-message request subject
	sub   *nats.Subscription
	in    chan *nats.Msg
	pin   string      // the pin ID the server gave this broker; "" when none
	timer *time.Timer // next's bound, reused

	// req is the last one-record request made, for reqWait and reqPin:
	// most are alike.
	req     []byte
	reqWait time.Duration
	reqPin  string
}

// newPuller makes a puller whose answers wait in a buffer of room
// messages: the records of one pull must fit, or nats.go drops those that
// do not (a slow consumer), and they come again only after AckWait.
func newPuller(js natsjs.JetStream, stream, consumer string, room int) (*puller, error) {
	nc := js.Conn()
	in := make(chan *nats.Msg, room)
	sub, err := nc.ChanSubscribe(nc.NewInbox(), in)
	if err != nil {
		return nil, err
	}
	return &puller{nc: nc, subj: apiPrefix(js) + "CONSUMER.MSG.NEXT." + stream + "." + consumer, sub: sub, in: in}, nil
}

// close ends the subscription: answers that come later are lost (the
// server redelivers a record after AckWait).
func (p *puller) close() { _ = p.sub.Unsubscribe() }

type pullRequest struct {
	Batch   int           `json:"batch"`
	Expires time.Duration `json:"expires"`
	NoWait  bool          `json:"no_wait,omitempty"`
	Group   string        `json:"group"`
	ID      string        `json:"id,omitempty"`
}

// pull asks for the next record, waiting up to wait on the server.
func (p *puller) pull(wait time.Duration) error {
	return p.nc.PublishRequest(p.subj, p.sub.Subject, p.request(wait))
}

// ackNext acks msg and, in the same message, asks for the next record,
// waiting up to wait on the server: the server reads the ack first.
func (p *puller) ackNext(msg record, wait time.Duration) error {
	r, ok := msg.(rawMsg)
	if !ok {
		return errors.New("pull: not a puller's record")
	}
	req := p.request(wait)
	body := make([]byte, 0, len("+NXT ")+len(req))
	body = append(append(body, "+NXT "...), req...)
	return p.nc.PublishRequest(r.m.Reply, p.sub.Subject, body)
}

// request is the body of a pull for one record.
func (p *puller) request(wait time.Duration) []byte {
	if p.req == nil || p.reqWait != wait || p.reqPin != p.pin {
		p.req, _ = json.Marshal(pullRequest{Batch: 1, Expires: wait, Group: priorityGroup, ID: p.pin})
		p.reqWait, p.reqPin = wait, p.pin
	}
	return p.req
}

// pullN asks for up to n records, waiting up to wait on the server. With
// noWait the server answers as soon as it has any: the records there are,
// then a 404 status, unless they were n.
func (p *puller) pullN(n int, wait time.Duration, noWait bool) error {
	req, _ := json.Marshal(pullRequest{Batch: n, Expires: wait, NoWait: noWait, Group: priorityGroup, ID: p.pin})
	return p.nc.PublishRequest(p.subj, p.sub.Subject, req)
}

// errPinned is a pull refused because another client holds the pin.
var errPinned = errors.New("pull: the partition is pinned to another client")

// next waits for a pull's answer: the record, or nil when the pull
// expired; an error when the server refused it. It gives up after bound
// (an answer lost with the connection), or when abort closes. A late
// answer is taken by the next call: a record is never lost.
func (p *puller) next(abort <-chan struct{}, bound time.Duration) (record, error) {
	if p.timer == nil {
		p.timer = time.NewTimer(bound)
	} else {
		p.timer.Reset(bound)
	}
	t := p.timer
	defer t.Stop()
	for {
		select {
		case m := <-p.in:
			if rec, end, err := p.answer(m); rec != nil || end {
				return rec, err
			}
		case <-abort:
			return nil, context.Canceled
		case <-t.C:
			return nil, errors.New("pull: no answer")
		}
	}
}

// answer reads one message of a pull's answer: a record, or the pull's
// end (end: it expired, or found nothing to wait for, with err when the
// server refused it); neither for a heartbeat.
func (p *puller) answer(m *nats.Msg) (rec record, end bool, err error) {
	status := ""
	if len(m.Data) == 0 && len(m.Header) > 0 {
		status = m.Header.Get("Status")
	}
	switch status {
	case "":
		if pin := m.Header.Get("Nats-Pin-Id"); pin != "" {
			p.pin = pin
		}
		return rawMsg{m, p.nc}, false, nil
	case "100": // a heartbeat or flow control: not an answer
		return nil, false, nil
	case "408", "404": // expired, or nothing to wait for
		return nil, true, nil
	case "423":
		p.pin = ""
		return nil, true, errPinned
	case "503": // nobody answered: the consumer is gone, or JetStream is not ready
		return nil, true, errNoConsumer
	case "409":
		if d := m.Header.Get("Description"); strings.EqualFold(d, "Consumer Deleted") {
			return nil, true, errNoConsumer
		}
	}
	return nil, true, fmt.Errorf("pull: %s %s", status, m.Header.Get("Description"))
}

// rawMsg is a record a puller received: a JetStream message, acked by
// publishing to its reply subject as nats.go does.
type rawMsg struct {
	m  *nats.Msg
	nc *nats.Conn
}

func (r rawMsg) Metadata() (*natsjs.MsgMetadata, error) {
	md, err := r.m.Metadata()
	if err != nil {
		return nil, err
	}
	return &natsjs.MsgMetadata{
		Sequence:     natsjs.SequencePair{Consumer: md.Sequence.Consumer, Stream: md.Sequence.Stream},
		NumDelivered: md.NumDelivered, NumPending: md.NumPending, Timestamp: md.Timestamp,
		Stream: md.Stream, Consumer: md.Consumer, Domain: md.Domain,
	}, nil
}

func (r rawMsg) Headers() nats.Header { return r.m.Header }
func (r rawMsg) Data() []byte         { return r.m.Data }

// DoubleAck acks and waits for the server to confirm it.
func (r rawMsg) DoubleAck(ctx context.Context) error {
	_, err := r.nc.RequestWithContext(ctx, r.m.Reply, []byte("+ACK"))
	return err
}

// termConfirmed is TermWithReason, waiting for the server to confirm it
// (it answers a Term sent as a request once it counted it acked).
func termConfirmed(ctx context.Context, msg record, reason string) error {
	r, ok := msg.(rawMsg)
	if !ok {
		return msg.TermWithReason(reason)
	}
	_, err := r.nc.RequestWithContext(ctx, r.m.Reply, []byte("+TERM "+reason))
	return err
}

func (r rawMsg) ack(body string) error { return r.nc.Publish(r.m.Reply, []byte(body)) }

func (r rawMsg) Ack() error        { return r.ack("+ACK") }
func (r rawMsg) Nak() error        { return r.ack("-NAK") }
func (r rawMsg) InProgress() error { return r.ack("+WPI") }

func (r rawMsg) NakWithDelay(delay time.Duration) error {
	return r.ack(`-NAK {"delay": ` + strconv.FormatInt(delay.Nanoseconds(), 10) + `}`)
}

func (r rawMsg) TermWithReason(reason string) error { return r.ack("+TERM " + reason) }
