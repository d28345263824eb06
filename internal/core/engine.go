package core

import (
	"context"

	"github.com/logbus/logbus/engine"
)

// NewEngine returns the in-memory engine: a Broker behind the boundary's
// interfaces. It keeps every promise of engine.Capabilities.
func NewEngine(cfg Config) (engine.Engine, error) {
	b, err := NewBroker(cfg)
	if err != nil {
		return nil, err
	}
	return memEngine{b}, nil
}

// memEngine adapts a Broker to engine.Engine: the Broker's methods return
// its concrete types, which its tests use, and these return them as the
// boundary's interfaces. A *Topic is an engine.Topic and a *Group an
// engine.Group as they are.
type memEngine struct{ *Broker }

var (
	_ engine.BatchSubscriber = memEngine{}
	_ engine.Topic           = (*Topic)(nil)
	_ engine.Group           = (*Group)(nil)
)

// Capabilities is every one: the in-memory engine is the reference, and a
// new capability is one it keeps.
func (memEngine) Capabilities() engine.Capabilities { return engine.AllCapabilities }

var _ engine.Snapshotter = memEngine{}

// CreateTopic creates the topic; it does not block, so ctx is unused.
func (e memEngine) CreateTopic(_ context.Context, name string, spec TopicSpec) (engine.Topic, error) {
	t, err := e.Broker.CreateTopic(name, spec)
	if err != nil {
		return nil, err
	}
	return t, nil
}

// Subscribe joins the group; it does not block, so ctx is unused.
func (e memEngine) Subscribe(_ context.Context, topic, group, consumer string, h Handler, onLeave func(), spec GroupSpec) (engine.Group, error) {
	g, err := e.Broker.Subscribe(topic, group, consumer, h, onLeave, spec)
	if err != nil {
		return nil, err
	}
	return g, nil
}

// Group looks the group up; it does not block, so ctx is unused.
func (e memEngine) Group(_ context.Context, topic, group string) (engine.Group, error) {
	g, err := e.Broker.Group(group, topic)
	if err != nil {
		return nil, err
	}
	return g, nil
}

// SubscribeBatch joins the group as a batch consumer; it does not block,
// so ctx is unused.
func (e memEngine) SubscribeBatch(_ context.Context, topic, group, consumer string, h engine.BatchHandler, onLeave func(), spec GroupSpec, batch engine.BatchSpec) (engine.Group, error) {
	g, err := e.Broker.SubscribeBatch(topic, group, consumer, h, onLeave, spec, batch)
	if err != nil {
		return nil, err
	}
	return g, nil
}
