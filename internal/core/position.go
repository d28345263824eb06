package core

import (
	"fmt"
)

// subscribe makes the cursor of a new group, named group, part of the
// low-water mark and starts it where from says, in one step under the lock,
// so no record before that point is ever read by the group. What was
// trimmed before the group existed is not the group's loss, so it is not
// counted as skipped.
func (p *Partition) subscribe(c *Cursor, group string, from Start) {
	p.mu.Lock()
	defer p.mu.Unlock()
	c.Set(p.startLocked(from))
	p.cursors = append(p.cursors, subscriber{group: group, cursor: c})
	p.lowWater = min(p.lowWater, c.Committed())
}

// startLocked returns the offset from names: within [base, next].
func (p *Partition) startLocked(from Start) int64 {
	switch from.Kind {
	case StartLatest:
		return p.next
	case StartOffset:
		return min(max(from.Offset, p.base), p.next)
	case StartTime:
		// Created follows the clock, which a test may move back: look at
		// every retained record rather than bisect.
		for o := p.base; o < p.next; o++ {
			if !p.ring.load(o).Created.Before(from.Time) {
				return o
			}
		}
		return p.next
	}
	return p.base
}

// seek moves c to offset, which must lie within [base, next]: else
// ErrOffsetOutOfRange. Holding mu makes the range check and the move one
// step, so no reclaim slips between them.
func (p *Partition) seek(c *Cursor, offset int64) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if offset < p.base || offset > p.next {
		return outOfRange(p.base, p.next)
	}
	p.moveLocked(c, offset)
	return nil
}

// seekStart moves c to where from says.
func (p *Partition) seekStart(c *Cursor, from Start) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.moveLocked(c, p.startLocked(from))
}

func (p *Partition) moveLocked(c *Cursor, offset int64) {
	c.Set(offset)
	p.lowWater = min(p.lowWater, offset)
	p.wakeProducersLocked() // a forward seek can free room
}

// outOfRange is the error of a seek to offset outside [earliest, end].
func outOfRange(earliest, end int64) error {
	return fmt.Errorf("%w: outside [%d, %d], the earliest retained record and the end",
		ErrOffsetOutOfRange, earliest, end)
}
