package core

import (
	"crypto/rand"
	"encoding/hex"
	"strconv"
	"strings"
	"sync/atomic"
)

// recordIDs names a partition's records when the broker has no IDSource.
// A record's default ID is its position, "<broker>-<topic>-<partition>-<offset>"
// (a random per-broker prefix, the topic's creation number in the broker,
// then the partition and the offset, as in "3f9a0c1d2e4b-1-0-42"): unique in
// the process, the same for every group and every redelivery, and free for
// the producer, which only appends.
//
// IDs are formatted when a record is delivered, 64 consecutive offsets in one
// string that every ID of the block is a substring of, so an ID costs no
// allocation of its own (a Message.ID keeps its block, about 1.5 KiB, alive).
// The blocks of the retained records are kept for the partition's groups to
// share, one slot per block of the retention window, so each block is
// formatted once however far apart the groups read (a replay far back may
// format one again). Blocks are immutable once published, so readers need
// no lock.
type recordIDs struct {
	prefix string
	recent []atomic.Pointer[idBlock] // block b in slot b % len(recent)
}

const idBlockLen = 64

type idBlock struct {
	first int64  // offset of the block's first ID
	names string // the block's IDs, back to back
	ends  [idBlockLen]uint16
}

// newBrokerIDPrefix returns a random prefix, so that the IDs of two brokers in
// one process differ.
func newBrokerIDPrefix() string {
	var raw [6]byte
	_, _ = rand.Read(raw[:]) // crypto/rand.Read never fails on supported platforms
	return hex.EncodeToString(raw[:])
}

// newRecordIDs names the records of a partition that retains up to retained
// records.
func newRecordIDs(brokerPrefix string, topicSeq, partition, retained int) *recordIDs {
	return &recordIDs{
		prefix: brokerPrefix + "-" + strconv.Itoa(topicSeq) + "-" + strconv.Itoa(partition) + "-",
		// The retained records span at most this many blocks.
		recent: make([]atomic.Pointer[idBlock], (retained+idBlockLen-1)/idBlockLen+1),
	}
}

// id returns the ID of the record at offset. It is block and name by
// hand: a call fewer per delivery of the per-record path.
func (r *recordIDs) id(offset int64) string {
	first := offset - offset%idBlockLen
	slot := &r.recent[(offset/idBlockLen)%int64(len(r.recent))]
	b := slot.Load()
	if b == nil || b.first != first {
		b = r.format(first)
		slot.Store(b)
	}
	return b.name(offset - first)
}

// fill puts the IDs of the records at first, first+1, ... in ids, looking
// each block up once rather than once per ID: a batch's records are
// consecutive.
func (r *recordIDs) fill(first int64, ids []string) {
	for i := 0; i < len(ids); {
		offset := first + int64(i)
		start := offset - offset%idBlockLen
		b := r.block(start)
		for j := offset - start; j < idBlockLen && i < len(ids); j++ {
			ids[i] = b.name(j)
			i++
		}
	}
}

// block returns the block that starts at first, formatting it if no
// group has yet.
func (r *recordIDs) block(first int64) *idBlock {
	slot := &r.recent[(first/idBlockLen)%int64(len(r.recent))]
	b := slot.Load()
	if b == nil || b.first != first {
		b = r.format(first)
		slot.Store(b)
	}
	return b
}

// name returns the i-th ID of the block.
func (b *idBlock) name(i int64) string {
	start := 0
	if i > 0 {
		start = int(b.ends[i-1])
	}
	return b.names[start:b.ends[i]]
}

func (r *recordIDs) format(first int64) *idBlock {
	b := &idBlock{first: first}
	var num [20]byte
	digits := strconv.AppendInt(num[:0], first, 10)
	// Every offset of the block has as many digits as the first one, or one
	// more, so this is enough room, and the one allocation of the names.
	var sb strings.Builder
	sb.Grow(idBlockLen * (len(r.prefix) + len(digits) + 1))
	for i := range idBlockLen {
		sb.WriteString(r.prefix)
		sb.Write(digits)
		b.ends[i] = uint16(sb.Len())
		digits = increment(digits)
	}
	b.names = sb.String()
	return b
}

// increment adds one to the decimal number in digits, in place when it can:
// consecutive offsets cost no formatting.
func increment(digits []byte) []byte {
	for i := len(digits) - 1; i >= 0; i-- {
		if digits[i] != '9' {
			digits[i]++
			return digits
		}
		digits[i] = '0'
	}
	return append([]byte{'1'}, digits...) // 99…9 + 1
}
