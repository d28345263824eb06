package jetstream

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/logbus/logbus/engine"
)

// Names on the server. A topic or group name may be any non-empty string;
// NATS allows far fewer characters in stream, consumer and subject names
// (no spaces, '.', '*', '>', path separators or control characters, and
// file-store streams name directories). So every name is encoded, never
// refused for its characters: ASCII letters, digits and '-' stand for
// themselves, and every other byte (including '_') becomes '_' and two
// upper-case hex digits. The encoding is injective and its output is a
// valid stream, consumer, subject-token and KV-key fragment, so distinct
// logbus names never share a server name. Only length is refused: a name
// whose server names would pass maxNameLen is ErrInvalid.
//
// With prefix P ([WithPrefix]), topic t and group g:
//
//	stream of partition i     P_T_<t>_P<i>          subject P.<t>.<i>
//	durable consumer          <g>_P<i>              on that stream
//	dead-letter stream        P_D_<t>_G_<g>         subject P.dlq.<t>.<g>
//	redrive stream            P_R_<t>_G_<g>         subject P.rdr.<t>.<g>.<i>
//	  its consumer            P<i>                  on that stream
//	redrive wake-up (core)    -                     subject P.rdw.<t>.<g>
//	membership bucket (KV)    P_members             key <t>.<g>.<consumer>
//
// A lone '_' in an encoded name is always followed by two hex digits, so
// the fixed markers (_T_, _P, _D_, _R_, _G_) cannot be forged by a name.
// Subjects differ in their token count or second token (a topic's has
// three tokens; dlq, rdr and rdw subjects four or five), so no stream
// captures another's.

// maxNameLen bounds every server name we derive: NATS accepts names up to
// 255 bytes, and a file-store stream is a directory, so leave room.
const maxNameLen = 200

// encodeName encodes s as described above.
func encodeName(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9', c == '-':
			b.WriteByte(c)
		default:
			fmt.Fprintf(&b, "_%02X", c)
		}
	}
	return b.String()
}

// names derives the server names of one engine, under its prefix.
type names struct {
	prefix string // already encoded
}

func (n names) stream(topic string, p int) string {
	return n.prefix + "_T_" + encodeName(topic) + "_P" + strconv.Itoa(p)
}

func (n names) subject(topic string, p int) string {
	return n.prefix + "." + encodeName(topic) + "." + strconv.Itoa(p)
}

func (n names) consumer(group string, p int) string {
	return encodeName(group) + "_P" + strconv.Itoa(p)
}

func (n names) dlqStream(topic, group string) string {
	return n.prefix + "_D_" + encodeName(topic) + "_G_" + encodeName(group)
}

func (n names) dlqSubject(topic, group string) string {
	return n.prefix + ".dlq." + encodeName(topic) + "." + encodeName(group)
}

func (n names) redriveStream(topic, group string) string {
	return n.prefix + "_R_" + encodeName(topic) + "_G_" + encodeName(group)
}

func (n names) redriveSubject(topic, group string, p int) string {
	return n.prefix + ".rdr." + encodeName(topic) + "." + encodeName(group) + "." + strconv.Itoa(p)
}

// redriveSubjects matches every partition's redrive subject of a group.
func (n names) redriveSubjects(topic, group string) string {
	return n.prefix + ".rdr." + encodeName(topic) + "." + encodeName(group) + ".*"
}

func (n names) redriveConsumer(p int) string { return "P" + strconv.Itoa(p) }

// redriveWake is the core NATS subject a Redrive announces itself on, so
// that the partitions' owners in other brokers look at once.
func (n names) redriveWake(topic, group string) string {
	return n.prefix + ".rdw." + encodeName(topic) + "." + encodeName(group)
}

func (n names) bucket() string { return n.prefix + "_members" }

func (n names) memberKey(topic, group, consumer string) string {
	return encodeName(topic) + "." + encodeName(group) + "." + encodeName(consumer)
}

func (n names) memberPrefix(topic, group string) string {
	return encodeName(topic) + "." + encodeName(group) + "."
}

// checkTopic refuses a topic whose server names would be too long.
func (n names) checkTopic(topic string, partitions int) error {
	if l := len(n.stream(topic, partitions-1)); l > maxNameLen {
		return fmt.Errorf("%w: topic %q: its stream name would be %d bytes, over the %d NATS allows here",
			engine.ErrInvalid, topic, l, maxNameLen)
	}
	return nil
}

// checkGroup refuses a group or consumer whose server names would be too
// long.
func (n names) checkGroup(topic, group, consumer string, partitions int) error {
	switch {
	case len(n.consumer(group, partitions-1)) > maxNameLen, len(n.dlqStream(topic, group)) > maxNameLen,
		len(n.redriveStream(topic, group)) > maxNameLen:
		return fmt.Errorf("%w: group %q: its server names would be over the %d bytes NATS allows here",
			engine.ErrInvalid, group, maxNameLen)
	case len(n.memberKey(topic, group, consumer)) > 4*maxNameLen:
		return fmt.Errorf("%w: consumer %q: its membership key would be too long", engine.ErrInvalid, consumer)
	}
	return nil
}

// decodeName inverts encodeName; a malformed escape stands for itself.
func decodeName(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '_' && i+2 < len(s) {
			if v, err := strconv.ParseUint(s[i+1:i+3], 16, 8); err == nil {
				b.WriteByte(byte(v))
				i += 2
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}
