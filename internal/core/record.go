package core

import "time"

// Record is a message once it has a place in the log. It is immutable after
// Append returns: every group reads the same *Record, and nothing on the read
// path copies it, so no code may write to it or to the slices and map it
// holds.
type Record struct {
	Topic     string
	Partition int
	Offset    int64
	ID        string
	Key       []byte // nil for a keyless record
	Value     []byte
	Headers   map[string]string // copied on publish; nil when there were none
	Created   time.Time         // from the broker's Clock
}

// Position is where a record landed.
type Position struct {
	Partition int
	Offset    int64
}
