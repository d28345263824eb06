package core

import (
	"context"
	"fmt"
	"maps"
)

// TopicConfig is what a topic is created with. Zero fields mean the defaults.
type TopicConfig struct {
	Partitions  int         // fixed for the topic's life; default 1
	Retention   Retention   // per partition
	Partitioner Partitioner // default KeyHash
}

// Topic is a named, fixed set of partitions and the rule that routes records
// to them.
type Topic struct {
	name        string
	broker      *Broker
	parts       []*Partition
	partitioner Partitioner
}

func newTopic(b *Broker, name string, cfg TopicConfig) (*Topic, error) {
	if name == "" {
		return nil, fmt.Errorf("%w: empty topic name", ErrInvalid)
	}
	if cfg.Partitions < 0 {
		return nil, fmt.Errorf("%w: topic %q: %d partitions", ErrInvalid, name, cfg.Partitions)
	}
	if cfg.Partitions == 0 {
		cfg.Partitions = 1
	}
	ret, err := cfg.Retention.Resolve()
	if err != nil {
		return nil, fmt.Errorf("topic %q: %w", name, err)
	}
	if cfg.Partitioner == nil {
		cfg.Partitioner = KeyHash()
	}
	t := &Topic{name: name, broker: b, partitioner: cfg.Partitioner}
	seq := int(b.topicSeq.Add(1))
	for i := range cfg.Partitions {
		part := newPartition(name, i, ret, b.clock)
		if b.ids == nil {
			part.ids = newRecordIDs(b.idPrefix, seq, i)
		}
		t.parts = append(t.parts, part)
	}
	return t, nil
}

// Name returns the topic's name.
func (t *Topic) Name() string { return t.name }

// Partitions returns the number of partitions.
func (t *Topic) Partitions() int { return len(t.parts) }

// Publish appends a record to the partition its key routes to and returns
// where it landed. It takes ownership of key and value: the caller must not
// modify them afterwards. headers are copied.
//
// It blocks only when the partition is full under Block (see
// Partition.Append). A done ctx fails the publish before anything is stored.
func (t *Topic) Publish(ctx context.Context, key, value []byte, headers map[string]string) (Position, error) {
	if t.broker.State() != Running {
		return Position{}, fmt.Errorf("%w: publish to topic %q", ErrClosed, t.name)
	}
	if err := ctx.Err(); err != nil {
		return Position{}, fmt.Errorf("publish to topic %q: %w", t.name, err)
	}
	p := t.partitioner.Partition(key, len(t.parts))
	if p < 0 || p >= len(t.parts) {
		return Position{}, fmt.Errorf("%w: topic %q: partitioner chose partition %d of %d", ErrInvalid, t.name, p, len(t.parts))
	}
	rec := &Record{
		Key:     key,
		Value:   value,
		Headers: maps.Clone(headers),
		Created: t.broker.clock.Now(),
		log:     t.parts[p],
	}
	if t.broker.ids != nil {
		rec.id = t.broker.ids.NextID()
	}
	off, err := t.parts[p].Append(ctx, rec)
	if err != nil {
		return Position{}, err
	}
	return Position{Partition: p, Offset: off}, nil
}

// Partition returns partition i, or nil when there is none.
func (t *Topic) Partition(i int) *Partition {
	if i < 0 || i >= len(t.parts) {
		return nil
	}
	return t.parts[i]
}

// Stats returns every partition's counters, by partition.
func (t *Topic) Stats() []PartitionStats {
	out := make([]PartitionStats, len(t.parts))
	for i, p := range t.parts {
		out[i] = p.Stats()
	}
	return out
}
