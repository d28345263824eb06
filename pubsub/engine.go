package pubsub

import (
	"context"

	"github.com/logbus/logbus/internal/core"
)

// The boundary between the typed API and the engine.
//
// Everything in this package is a typed facade: values are encoded on publish
// and decoded once per delivery, and the log itself (partitions, offsets,
// groups, workers) lives in the engine, which knows only bytes. The facade
// uses the engine through exactly the methods listed below and nothing else,
// so a second engine (a distributed one) can be put behind the same typed
// API by implementing them. Keep this list short: add to it only what cannot
// be built from what is here.
//
// Config and result types (core.TopicConfig, core.GroupConfig,
// core.GroupStats, core.DeadLetter, core.PartitionStats, core.Start) are
// plain data and cross the boundary by value. A core.Record is read through
// its exported fields and its Topic, Partition and ID methods; the facade
// writes only a record NewRecord gave it, and only its Key, Value and
// Headers, before handing it to PublishRecord or PublishBatch. The sentinel
// errors and the partitioners are the engine's own values, re-exported
// (errors.go, topic.go): a second engine must return and accept the same
// ones. The engine's ShutdownError and PanicError are turned into pubsub's
// own types on the way out (fail, Group.DeadLetters). The only
// engine-specific signal a handler sends back is core.ErrAbandoned (and
// core.ErrNotDelivered, for a delivery taken back after its revoked channel
// closed), from Stream.
type (
	engine interface {
		CreateTopic(name string, cfg core.TopicConfig) (*core.Topic, error)
		Subscribe(topic, group, consumer string, h core.Handler, onLeave func(), cfg core.GroupConfig) (*core.Group, error)
		Group(name, topic string) (*core.Group, error)
		Drain(ctx context.Context) error
		Close(ctx context.Context) error
		State() core.State
	}
	engineTopic interface {
		Name() string
		Partitions() int
		NewRecord() *core.Record
		PublishRecord(ctx context.Context, rec *core.Record) (core.Position, error)
		PublishBatch(ctx context.Context, n int, fill func(i int, rec *core.Record) error, landed func(i int, pos core.Position)) (int, error)
		Stats() []core.PartitionStats
	}
	engineGroup interface {
		Name() string
		Leave(ctx context.Context, consumer string) error
		Assignment() map[string][]int
		Pause(ctx context.Context) error
		Resume()
		Seek(ctx context.Context, partition int, offset int64) error
		Replay(ctx context.Context, from core.Start) error
		Committed(partition int) int64
		Lag() int64
		Stats() core.GroupStats
		DeadLetters() []core.DeadLetter
	}
)

var (
	_ engine      = (*core.Broker)(nil)
	_ engineTopic = (*core.Topic)(nil)
	_ engineGroup = (*core.Group)(nil)
)
