package pubsub

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"maps"
	"time"

	"github.com/logbus/logbus/internal/engine"
)

// The calls below act on a group by name, for tools that hold the Broker
// but not the typed Topic and Group (a debug page, an admin endpoint), as
// Broker.Lag and Broker.Replay do. Each fails with ErrTopicNotFound for an
// unknown topic and ErrSubscription for an unknown group, and otherwise
// behaves as the Group method it names.

// Pause pauses group on topic by name; see Group.Pause.
func (b *Broker) Pause(ctx context.Context, group, topic string) error {
	g, err := b.group(ctx, group, topic)
	if err == nil {
		err = g.Pause(ctx)
	}
	err = fail(err, "pause group %q on topic %q", group, topic)
	b.obs.operator("paused", topic, group, err)
	return err
}

// Resume resumes group on topic by name; see Group.Resume.
func (b *Broker) Resume(ctx context.Context, group, topic string) error {
	g, err := b.group(ctx, group, topic)
	if err == nil {
		err = g.Resume(ctx)
	}
	err = fail(err, "resume group %q on topic %q", group, topic)
	b.obs.operator("resumed", topic, group, err)
	return err
}

// RawDeadLetter is a dead letter as bytes: what a tool that does not know
// a topic's types can show of it. Key, Value and Headers are the caller's
// own copies.
type RawDeadLetter struct {
	ID        string
	Topic     string
	Partition int
	Offset    int64
	Key       []byte // nil for a keyless record
	Value     []byte
	Headers   map[string]string
	Created   time.Time
	Attempts  int       // deliveries made, the last included
	Err       error     // the last attempt's error: a *DecodeError, a *PanicError or the handler's
	FailedAt  time.Time // by the broker's Clock
}

func rawLetter(l *engine.DeadLetter) RawDeadLetter {
	return RawDeadLetter{ID: l.ID, Topic: l.Topic, Partition: l.Partition, Offset: l.Record.Offset,
		Key: bytes.Clone(l.Record.Key), Value: bytes.Clone(l.Record.Value), Headers: maps.Clone(l.Record.Headers),
		Created: l.Record.Created, Attempts: l.Attempts, Err: publicErr(l.Err), FailedAt: l.FailedAt}
}

// DeadLetters returns the dead letters of group on topic, oldest first, as
// bytes; see Group.DeadLetters. It does not block.
func (b *Broker) DeadLetters(group, topic string) ([]RawDeadLetter, error) {
	g, err := b.group(context.Background(), group, topic)
	if err != nil {
		return nil, fail(err, "dead letters of group %q on topic %q", group, topic)
	}
	letters := g.DeadLetters()
	out := make([]RawDeadLetter, len(letters))
	for i := range letters {
		out[i] = rawLetter(&letters[i])
	}
	return out, nil
}

// Redrive sends the dead letters of group on topic that match accepts
// (every one when match is nil) back to that group; see Group.Redrive.
func (b *Broker) Redrive(ctx context.Context, group, topic string, match func(RawDeadLetter) bool) (int, error) {
	g, err := b.group(ctx, group, topic)
	n := 0
	if err == nil {
		n, err = redrive(ctx, g, func(l *engine.DeadLetter) bool { return match(rawLetter(l)) }, match == nil)
	}
	err = fail(err, "redrive group %q on topic %q", group, topic)
	b.obs.operator("redrove dead letters", topic, group, err, slog.Int("count", n))
	return n, err
}

// group looks a group up by name, checking b and ctx first.
func (b *Broker) group(ctx context.Context, group, topic string) (engine.Group, error) {
	if err := b.check(ctx); err != nil {
		return nil, err
	}
	return b.eng.Group(ctx, topic, group)
}

// redrive asks g's engine to redrive what match accepts, or everything.
func redrive(ctx context.Context, g engine.Group, match func(*engine.DeadLetter) bool, all bool) (int, error) {
	r, ok := g.(engine.Redriver)
	if !ok {
		return 0, fmt.Errorf("%w: the engine cannot redrive dead letters", ErrInvalid)
	}
	if all {
		match = nil
	}
	return r.Redrive(ctx, match)
}
