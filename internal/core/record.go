package core

import "time"

// Record is a message once it has a place in the log. It is immutable while
// it is retained: every group reads the same *Record, and nothing on the read
// path copies it, so no code may write to it or to the slices and map it
// holds.
//
// A *Record is valid until every group has committed past it: then the
// partition may reuse it for a new record (see Partition.reclaimLocked). So
// a Handler must not keep rec after it returns, and anything that outlives
// the delivery (a dead letter) keeps a copy.
type Record struct {
	Offset  int64
	Key     []byte // nil for a keyless record
	Value   []byte
	Headers map[string]string // copied on publish; nil when there were none
	Created time.Time         // from the broker's Clock

	log *Partition // where the record lives
	id  string     // from the broker's IDSource; empty when the log names it
}

// Topic returns the name of the record's topic.
func (r *Record) Topic() string { return r.log.topic }

// Partition returns the index of the record's partition.
func (r *Record) Partition() int { return r.log.index }

// ID returns the record's ID: the broker's IDSource's, or else one named
// after its position (see recordIDs).
func (r *Record) ID() string {
	if r.id != "" || r.log.ids == nil {
		return r.id
	}
	return r.log.ids.id(r.Offset)
}

// Position is where a record landed.
type Position struct {
	Partition int
	Offset    int64
}
