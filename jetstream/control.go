package jetstream

// The calls that move a group: Pause and Resume (the server's consumer
// pause), Seek and Replay (resets of its consumers).

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/logbus/logbus/engine"
)

// Pause pauses the group's consumers on the server (its redrive consumers
// too), so no broker gets records until Resume, and waits for this
// broker's deliveries in flight.
// When ctx ends first, the group is paused all the same.
func (g *group) Pause(ctx context.Context) error {
	if err := g.refuseGone(); err != nil {
		return err
	}
	g.mu.Lock()
	if g.closed {
		g.mu.Unlock()
		return nil
	}
	if !g.paused {
		g.paused = true
		for _, s := range g.slots {
			s.hold()
		}
	}
	g.mu.Unlock()
	until := time.Now().Add(100 * 365 * 24 * time.Hour)
	g.cfgMu.Lock()
	for p, s := range g.t.streams {
		if _, err := s.PauseConsumer(ctx, g.e.names.consumer(g.name, p), until); err != nil {
			g.cfgMu.Unlock()
			return g.serverErr(ctx, fmt.Errorf("partition %d: %w", p, err))
		}
		// The redrive consumer too, so that no broker delivers a redriven
		// letter while the group is paused.
		if _, err := g.rdq.PauseConsumer(ctx, g.e.names.redriveConsumer(p), until); err != nil {
			g.cfgMu.Unlock()
			return g.e.ctxErr(ctx, fmt.Errorf("partition %d: redrive: %w", p, err))
		}
	}
	g.cfgMu.Unlock()
	g.mu.Lock()
	g.pausedOn = g.paused
	g.mu.Unlock()
	for _, s := range g.slots {
		if err := s.waitIdle(ctx, false); err != nil {
			return fmt.Errorf("deliveries in flight go on: %w", err)
		}
	}
	return nil
}

// followResume releases this broker's holds when the group was paused
// here but another broker resumed it on the server.
func (g *group) followResume() {
	g.mu.Lock()
	on := g.pausedOn
	g.mu.Unlock()
	if !on {
		return
	}
	ctx, cancel := g.e.ctx()
	info, err := g.consumers[0].Info(ctx)
	cancel()
	if err != nil || info.Paused {
		return
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.paused && g.pausedOn {
		g.paused, g.pausedOn = false, false
		for _, s := range g.slots {
			s.unhold()
		}
	}
}

// Resume resumes the group's consumers on the server.
func (g *group) Resume(ctx context.Context) error {
	if err := g.refuseGone(); err != nil {
		return err
	}
	g.mu.Lock()
	if g.closed {
		g.mu.Unlock()
		return nil
	}
	g.mu.Unlock()
	g.cfgMu.Lock()
	for p, s := range g.t.streams {
		if _, err := s.ResumeConsumer(ctx, g.e.names.consumer(g.name, p)); err != nil {
			g.cfgMu.Unlock()
			return g.serverErr(ctx, fmt.Errorf("partition %d: %w", p, err))
		}
		if _, err := g.rdq.ResumeConsumer(ctx, g.e.names.redriveConsumer(p)); err != nil {
			g.cfgMu.Unlock()
			return g.e.ctxErr(ctx, fmt.Errorf("partition %d: redrive: %w", p, err))
		}
	}
	g.cfgMu.Unlock()
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.paused {
		g.paused, g.pausedOn = false, false
		for _, s := range g.slots {
			s.unhold()
		}
	}
	return nil
}

// Seek moves partition's consumer so that offset is read next.
func (g *group) Seek(ctx context.Context, partition int, offset int64) error {
	if err := g.e.refuse("seek"); err != nil {
		return err
	}
	if err := g.refuseGone(); err != nil {
		return err
	}
	if partition < 0 || partition >= g.t.parts {
		return fmt.Errorf("%w: topic %q has no partition %d", engine.ErrInvalid, g.t.name, partition)
	}
	info, err := g.t.streamInfo(ctx, partition)
	if err != nil {
		return g.serverErr(ctx, err)
	}
	first, last := info.State.FirstSeq, info.State.LastSeq
	if first == 0 {
		first = 1
	}
	if offset < int64(first)-1 || offset > int64(last) {
		return fmt.Errorf("offset %d outside [%d, %d]: %w", offset, int64(first)-1, last, engine.ErrOffsetOutOfRange)
	}
	return g.reposition(ctx, map[int]uint64{partition: uint64(offset) + 1})
}

// Replay moves every partition's consumer to from.
func (g *group) Replay(ctx context.Context, from engine.Start) error {
	if err := g.e.refuse("replay"); err != nil {
		return err
	}
	if err := g.refuseGone(); err != nil {
		return err
	}
	if err := from.Validate(); err != nil {
		return err
	}
	seqs, err := g.startSeqs(ctx, from)
	if err != nil {
		return err
	}
	m := make(map[int]uint64, len(seqs))
	for p, s := range seqs {
		m[p] = s
	}
	return g.reposition(ctx, m)
}

// reposition holds the partitions, waits until this broker's workers for
// them are neither delivering nor pulling, resets the consumers to the
// given sequences on the server, and lets the workers go on from there: a
// record a worker fetched before is dropped (the reset made it moot).
// When ctx ends before the workers are idle, nothing has moved.
func (g *group) reposition(ctx context.Context, seqs map[int]uint64) error {
	ps := make([]int, 0, len(seqs))
	for p := range seqs {
		ps = append(ps, p)
	}
	slices.Sort(ps)
	for _, p := range ps {
		g.slots[p].hold()
	}
	defer func() {
		for _, p := range ps {
			g.slots[p].unhold()
		}
	}()
	for _, p := range ps {
		if err := g.slots[p].waitIdle(ctx, true); err != nil {
			return fmt.Errorf("nothing moved: %w", err)
		}
	}
	for _, p := range ps {
		// The server does not answer a reset of a consumer that does not
		// exist: ask for it first (a group another broker deleted).
		if _, err := g.consumerInfo(ctx, p); err != nil {
			if gone := g.refuseGone(); gone != nil {
				return gone
			}
			return g.e.ctxErr(ctx, fmt.Errorf("partition %d: %w", p, err))
		}
		if _, err := g.t.streams[p].ResetConsumerToSequence(ctx, g.e.names.consumer(g.name, p), seqs[p]); err != nil {
			return g.serverErr(ctx, fmt.Errorf("partition %d: %w", p, err))
		}
		g.slots[p].bumpEpoch(seqs[p])
	}
	return nil
}
