package core

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/logbus/logbus/engine"
)

// Topic is a named, fixed set of partitions. Which partition a record goes
// to is the caller's choice (the typed layer routes).
type Topic struct {
	name   string
	broker *Broker
	parts  []*Partition
	free   sync.Pool // of *Record: reclaimed records, for NewRecord to reuse
	// freeLists are batches' worth of reclaimed records, for NewRecords:
	// the pool above is fast for one record at a time but slow for a
	// batch's worth, so a batch takes and gives back its records in one
	// step each.
	freeLists sync.Pool // of *[]*Record

	deleted atomic.Bool // DeleteTopic deleted it: appends fail with ErrTopicNotFound
}

func newTopic(b *Broker, name string, spec TopicSpec) (*Topic, error) {
	spec, err := spec.Resolve(name)
	if err != nil {
		return nil, err
	}
	ret := spec.Retention
	t := &Topic{name: name, broker: b, parts: make([]*Partition, 0, spec.Partitions)}
	seq := int(b.topicSeq.Add(1))
	for i := range spec.Partitions {
		part := newPartition(name, i, ret, b.ageClock, &t.free, b.obs)
		if b.ids == nil {
			part.ids = newRecordIDs(b.idPrefix, seq, i, ret.MaxMessages)
		}
		t.parts = append(t.parts, part)
	}
	return t, nil
}

// Name returns the topic's name.
func (t *Topic) Name() string { return t.name }

// Partitions returns the number of partitions.
func (t *Topic) Partitions() int { return len(t.parts) }

// NewRecord returns an empty record for the caller to fill (Key, Value and
// Headers) and give to Append. It may be a record the topic reclaimed:
// then its Key and Value are empty slices over that record's buffers (at
// most maxReusedBuffer bytes each), which the caller may append to instead
// of allocating. Whoever does must be sure that nothing made from the
// earlier record still refers to those bytes: appending is safe only for a
// topic whose readers copy what they take from a record.
func (t *Topic) NewRecord() *Record {
	if rec, ok := t.free.Get().(*Record); ok {
		return rec
	}
	return new(Record)
}

// NewRecords fills recs with empty records, as NewRecord does one, taking
// them from the records earlier batches reclaimed when it can.
func (t *Topic) NewRecords(recs []*Record) {
	n := 0
	if fl, ok := t.freeLists.Get().(*[]*Record); ok {
		free := *fl
		for n < len(recs) && len(free) > 0 {
			recs[n] = free[len(free)-1]
			free[len(free)-1] = nil
			free = free[:len(free)-1]
			n++
		}
		*fl = free
		// Emptied, it goes back all the same: AppendBatch refills it
		// without growing it. Dropping it cost a batch publish about
		// eight allocations as AppendBatch grew a new one from nothing.
		t.freeLists.Put(fl)
	}
	for ; n < len(recs); n++ {
		recs[n] = t.NewRecord()
	}
}

// maxFreeList bounds the records one free list keeps.
const maxFreeList = 4096

// AppendOne appends rec, filled by the caller, to partition and returns
// its offset; see AppendBatch.
func (t *Topic) AppendOne(ctx context.Context, partition int, rec *Record) (int64, error) {
	recs := [1]*Record{rec}
	parts := [1]int{partition}
	if err := t.appendable(ctx, parts[:], recs[:]); err != nil {
		return 0, err
	}
	var offset [1]int64
	if _, err := t.parts[partition].Append(ctx, recs[:], offset[:]); err != nil {
		return 0, err
	}
	return offset[0], nil
}

// AppendBatch appends recs[i], filled by the caller, to partitions[i], in
// order, run by run (engine.Runs), and puts the offset of recs[i] in
// offsets[i]. It stamps every record with one clock reading and names it
// with the broker's IDSource, if any, and takes ownership of it and its
// key, value and headers. It returns how many it stored: all of them, or,
// with an error, the first ones.
//
// It blocks only when a partition is full under Block (see
// Partition.Append). A done ctx, a partition that does not exist or a
// record larger than its partition's MaxBytes fails it before anything is
// stored.
func (t *Topic) AppendBatch(ctx context.Context, partitions []int, recs []*Record, offsets []int64) (int, error) {
	if err := t.appendable(ctx, partitions, recs); err != nil {
		return 0, err
	}
	fl, ok := t.freeLists.Get().(*[]*Record)
	if !ok {
		fl = new([]*Record)
	}
	defer func() {
		if len(*fl) <= maxFreeList {
			t.freeLists.Put(fl)
		}
	}()
	for start, end := range engine.Runs(partitions) {
		stored, err := t.parts[partitions[start]].appendFreeing(ctx, recs[start:end], offsets[start:end], fl)
		if err != nil {
			return start + stored, err
		}
	}
	return len(recs), nil
}

// appendable checks that recs may be appended to partitions, and stamps
// and names them.
func (t *Topic) appendable(ctx context.Context, partitions []int, recs []*Record) error {
	if t.broker.State() != Running {
		return ErrClosed
	}
	if t.deleted.Load() {
		return fmt.Errorf("%w: the topic was deleted", ErrTopicNotFound)
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	for i, p := range partitions {
		if p < 0 || p >= len(t.parts) {
			return fmt.Errorf("%w: no partition %d of %d", ErrInvalid, p, len(t.parts))
		}
		if part := t.parts[p]; part.ret.MaxBytes > 0 {
			if err := part.tooLarge(recs[i]); err != nil {
				return err
			}
		}
	}
	now := t.broker.clock.Now()
	for _, rec := range recs {
		rec.Created = now
		if t.broker.ids != nil {
			rec.ID = t.broker.ids.NextID()
		}
	}
	return nil
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

var _ engine.RecordIDer = (*Topic)(nil)

// RecordID returns the ID of the record at offset of partition: computed
// from its position for the default IDs, else read from the record while
// it is retained ("" once it is not).
func (t *Topic) RecordID(partition int, offset int64) string {
	p := t.Partition(partition)
	switch {
	case p == nil || offset < 0:
		return ""
	case p.ids != nil:
		return p.ids.id(offset)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if offset < p.base || offset >= p.next {
		return ""
	}
	return p.ring.load(offset).ID
}
