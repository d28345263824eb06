package jetstream

import (
	"fmt"
	"time"

	"github.com/logbus/logbus/engine"
)

// Option configures an engine. Options only record; New, Connect and
// [Server.Engine] check them all at once.
type Option interface{ apply(*config) }

type optionFunc func(*config)

func (f optionFunc) apply(c *config) { f(c) }

// Storage says where the server keeps a topic's records.
type Storage int

const (
	// FileStorage keeps records on disk: they survive a restart of the
	// server. The default.
	FileStorage Storage = iota
	// MemoryStorage keeps records in the server's memory only.
	MemoryStorage
)

type config struct {
	prefix         string
	storage        Storage
	ackWait        time.Duration
	memberTTL      time.Duration
	pollWait       time.Duration
	requestTimeout time.Duration
	replicas       int
}

// The defaults of the options.
const (
	DefaultPrefix         = "logbus"
	DefaultAckWait        = 30 * time.Second
	DefaultMemberTTL      = 5 * time.Second
	DefaultPollWait       = 250 * time.Millisecond
	DefaultRequestTimeout = 5 * time.Second
)

func defaultConfig() config {
	return config{prefix: DefaultPrefix, ackWait: DefaultAckWait, memberTTL: DefaultMemberTTL,
		pollWait: DefaultPollWait, requestTimeout: DefaultRequestTimeout, replicas: 1}
}

// WithPrefix sets the namespace of every name the engine creates on the
// server (JetStream streams, subjects, the membership buckets), overriding
// "logbus".
// Brokers that must share topics and groups use the same prefix; brokers
// with different prefixes share nothing. It is encoded like a topic name.
func WithPrefix(p string) Option { return optionFunc(func(c *config) { c.prefix = p }) }

// WithStorage sets where topics and dead letters are stored, overriding
// [FileStorage]. Brokers that share a topic must use the same storage: a
// topic that exists with the other one is ErrTopicExists. The membership
// and assignment buckets are on file whatever it says, so that a group's
// membership outlives a restart of its server.
func WithStorage(s Storage) Option { return optionFunc(func(c *config) { c.storage = s }) }

// WithAckWait sets how long the server waits for a delivery's outcome
// before it redelivers it, overriding 30s. While a handler runs the engine
// tells the server it is still working every AckWait/3, so a long handler
// is never redelivered behind its back; AckWait is therefore how long it
// takes for the record a crashed process was handling to be delivered
// again (with Attempt+1).
func WithAckWait(d time.Duration) Option { return optionFunc(func(c *config) { c.ackWait = d }) }

// WithMemberTTL sets how long a consumer stays a member of its group
// without a heartbeat, overriding 5s. Heartbeats go every TTL/3, and a
// broker checks then for members whose keys expired (joins, leaves and
// new assignments it hears of at once, by watching the bucket). It is also
// how long the server keeps a partition's pulls for its owner without
// hearing from it: a crashed process's partitions move to the remaining
// members within about 4/3 TTL of its last heartbeat, and the record it
// was handling comes again after AckWait ([WithAckWait]). Brokers that
// share a prefix must use the same TTL: it is the membership bucket's.
func WithMemberTTL(d time.Duration) Option { return optionFunc(func(c *config) { c.memberTTL = d }) }

// WithPollWait sets how long one pull for a partition's next record waits
// on the server, overriding 250ms. A partition's worker acts on Pause,
// Seek, Replay, a rebalance and Close between pulls, so this bounds how
// long those wait on an idle partition; an idle partition sends one pull
// per PollWait.
func WithPollWait(d time.Duration) Option { return optionFunc(func(c *config) { c.pollWait = d }) }

// WithRequestTimeout bounds the server requests of the calls that take no
// context (Stats, Lag, Committed, Assignment, DeadLetters, and the
// engine's own housekeeping), and of those whose context has no deadline
// (a Publish waiting out an outage, from its first failed attempt; Ping;
// DeleteGroup and DeleteTopic), overriding 5s.
func WithRequestTimeout(d time.Duration) Option {
	return optionFunc(func(c *config) { c.requestTimeout = d })
}

// WithReplicas sets how many servers of a cluster keep each JetStream
// stream, consumer and KV bucket the engine creates (a topic's partitions, a
// group's consumers, dead letters and redriven letters, the membership
// and assignment buckets), overriding 1. It takes 1 to 5, as the server
// does; anything else is pubsub.ErrInvalid. The server refuses more replicas
// than the cluster has JetStream servers (a single server takes only 1),
// and the engine's error then says how many it asked for. What each count
// costs and survives is in the package documentation (Replicas).
//
// It applies to what this engine creates: a JetStream stream, consumer or
// bucket that exists already keeps its replica count (a broker attaches to it
// whatever its own option says, so brokers with different settings do
// not undo each other). Change an existing one with the server's tools
// (nats stream edit --replicas).
func WithReplicas(n int) Option { return optionFunc(func(c *config) { c.replicas = n }) }

func (c config) validate() error {
	switch {
	case c.prefix == "":
		return fmt.Errorf("%w: jetstream: empty prefix", engine.ErrInvalid)
	case len(encodeName(c.prefix)) > maxNameLen/2:
		return fmt.Errorf("%w: jetstream: prefix %q is too long", engine.ErrInvalid, c.prefix)
	case c.storage != FileStorage && c.storage != MemoryStorage:
		return fmt.Errorf("%w: jetstream: unknown storage %d", engine.ErrInvalid, c.storage)
	case c.ackWait < 100*time.Millisecond:
		return fmt.Errorf("%w: jetstream: AckWait %v is under 100ms", engine.ErrInvalid, c.ackWait)
	case c.memberTTL < 100*time.Millisecond:
		return fmt.Errorf("%w: jetstream: MemberTTL %v is under 100ms", engine.ErrInvalid, c.memberTTL)
	case c.pollWait < 10*time.Millisecond:
		return fmt.Errorf("%w: jetstream: PollWait %v is under 10ms", engine.ErrInvalid, c.pollWait)
	case c.replicas < 1 || c.replicas > 5:
		return fmt.Errorf("%w: jetstream: %d replicas: the server keeps 1 to 5", engine.ErrInvalid, c.replicas)
	case c.requestTimeout <= 0:
		return fmt.Errorf("%w: jetstream: RequestTimeout %v", engine.ErrInvalid, c.requestTimeout)
	}
	return nil
}
