package jetstream

// Pause and Resume: the server's consumer pause, for every broker, and
// this broker's holds on its slots while the group is paused.

import (
	"context"
	"fmt"
	"sync"

	natsjs "github.com/nats-io/nats.go/jetstream"
)

// pausing is a group's pause as this broker holds it, and the lock that
// serialises this broker's changes of the consumers' configuration.
type pausing struct {
	g *group

	// cfgMu serialises this broker's changes of the consumers'
	// configuration: pause, resume, and MaxAckPending (batch.go), which
	// rewrites the whole configuration and so must not undo a pause. It
	// is held across those requests, with no other lock.
	cfgMu sync.Mutex

	mu       sync.Mutex // guards the fields below; then a slot's mu may be taken
	paused   bool       // Pause holds every slot
	pausedOn bool       // and the server confirmed the pause: from then on a resume by another broker releases the holds
}

// isPaused reports whether Pause holds the slots.
func (ps *pausing) isPaused() bool {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	return ps.paused
}

// moot reports whether a Pause or Resume has nothing to do: once the
// group was deleted (the deletion's error), or Close began (nil).
func (ps *pausing) moot() (bool, error) {
	if err := ps.g.fate.err(); err != nil {
		return true, err
	}
	return ps.g.members.isClosed(), nil
}

// pause pauses the group's consumers on the server (its redrive consumers
// too), so no broker gets records until Resume, and waits for this
// broker's deliveries in flight. When ctx ends first, the group is paused
// all the same.
func (ps *pausing) pause(ctx context.Context) error {
	g := ps.g
	if done, err := ps.moot(); done {
		return err
	}
	ps.mu.Lock()
	if !ps.paused {
		ps.paused = true
		for _, s := range g.slots {
			s.hold()
		}
	}
	ps.mu.Unlock()
	// The redrive consumers too, so that no broker delivers a redriven
	// letter while the group is paused.
	err := ps.eachConsumer(ctx, func(s natsjs.Stream, consumer string) error {
		_, err := s.PauseConsumer(ctx, consumer, forever)
		return err
	})
	if err != nil {
		return err
	}
	ps.mu.Lock()
	ps.pausedOn = ps.paused
	ps.mu.Unlock()
	for _, s := range g.slots {
		if err := s.waitIdle(ctx, false); err != nil {
			return fmt.Errorf("deliveries in flight go on: %w", err)
		}
	}
	return nil
}

// resume resumes the group's consumers on the server, and releases this
// broker's holds.
func (ps *pausing) resume(ctx context.Context) error {
	if done, err := ps.moot(); done {
		return err
	}
	err := ps.eachConsumer(ctx, func(s natsjs.Stream, consumer string) error {
		_, err := s.ResumeConsumer(ctx, consumer)
		return err
	})
	if err != nil {
		return err
	}
	ps.release(false)
	return nil
}

// eachConsumer calls set on every partition's consumer, then on its
// redrive consumer, partition by partition, under cfgMu: a pause or a
// resume. The first failure ends it, and is returned as the group's
// server errors are (a consumer gone means the group was deleted), once
// cfgMu is released.
func (ps *pausing) eachConsumer(ctx context.Context, set func(s natsjs.Stream, consumer string) error) error {
	g := ps.g
	var err error
	p, redrive := 0, false
	ps.cfgMu.Lock()
	for p = range g.t.parts {
		if err = set(g.t.streams[p], g.e.names.consumer(g.name, p)); err != nil {
			break
		}
		if err = set(g.redrive.rdq, g.e.names.redriveConsumer(p)); err != nil {
			redrive = true
			break
		}
	}
	ps.cfgMu.Unlock()
	switch {
	case err == nil:
		return nil
	case redrive:
		return g.e.ctxErr(ctx, fmt.Errorf("partition %d: redrive: %w", p, err))
	}
	return g.fate.serverErr(ctx, fmt.Errorf("partition %d: %w", p, err))
}

// follow releases this broker's holds when the group was paused here but
// another broker resumed it on the server.
func (ps *pausing) follow() {
	ps.mu.Lock()
	on := ps.pausedOn
	ps.mu.Unlock()
	if !on {
		return
	}
	ctx, cancel := ps.g.e.ctx()
	info, err := ps.g.consumers[0].Info(ctx)
	cancel()
	if err != nil || info.Paused {
		return
	}
	ps.release(true)
}

// release ends the holds of a pause: with confirmed, only of one the
// server confirmed.
func (ps *pausing) release(confirmed bool) {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	if ps.paused && (ps.pausedOn || !confirmed) {
		ps.paused, ps.pausedOn = false, false
		for _, s := range ps.g.slots {
			s.unhold()
		}
	}
}

// setMaxAckPending makes partition p's consumer allow n records unacked,
// when it does not already. The server takes a whole configuration, so
// the one it has is read and sent back changed: cfgMu keeps this broker's
// Pause and Resume out meanwhile (a Pause by another broker in between
// would be undone: a narrow window when a worker starts).
func (ps *pausing) setMaxAckPending(p, n int) error {
	g := ps.g
	ps.cfgMu.Lock()
	defer ps.cfgMu.Unlock()
	ctx, cancel := g.e.ctx()
	defer cancel()
	info, err := g.consumers[p].Info(ctx)
	if err != nil {
		return err
	}
	if info.Config.MaxAckPending == n {
		return nil
	}
	cfg := info.Config
	cfg.MaxAckPending = n
	_, err = g.e.js.UpdateConsumer(ctx, g.e.names.stream(g.t.name, p), cfg)
	return err
}
