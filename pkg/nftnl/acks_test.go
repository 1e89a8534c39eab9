package nftnl

import (
	"encoding/binary"
	"errors"
	"os"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// ackReply is an nlmsgerr reply as the kernel sends it with NETLINK_CAP_ACK:
// the error number and the request's header.
func ackReply(typ uint16, seq uint32, code int32) []byte {
	b := appendNlmsghdr(nil, nlmsgHeaderLen+4+nlmsgHeaderLen, typ, 0)
	binary.NativeEndian.PutUint32(b[8:], seq)
	b = binary.NativeEndian.AppendUint32(b, uint32(code))
	return append(b, make([]byte, nlmsgHeaderLen)...)
}

// TestReadAcks feeds readAcks datagrams through a socket pair: the
// acknowledgements of every element message end the wait whatever their
// order (duplicates and other sequence numbers ignored); an error reply,
// a reply too long or malformed, and silence until the deadline are
// errors.
func TestReadAcks(t *testing.T) {
	const first, msgs = 100, 3
	for _, tc := range []struct {
		name    string
		replies [][]byte
		want    string // "" for success
		is      error
	}{
		{name: "all acknowledged", replies: [][]byte{
			ackReply(unix.NLMSG_ERROR, first+2, 0),
			ackReply(unix.NLMSG_ERROR, first+2, 0),
			ackReply(unix.NLMSG_ERROR, first, 0),
			ackReply(unix.NLMSG_ERROR, first+9, 0),
			ackReply(unix.NLMSG_ERROR, first+3, 0),
			ackReply(unix.NLMSG_ERROR, first+1, 0),
		}},
		{name: "error reply", replies: [][]byte{
			ackReply(unix.NLMSG_ERROR, first+1, 0),
			ackReply(unix.NLMSG_ERROR, first+2, -int32(unix.ENOENT)),
		}, want: "no such file or directory", is: unix.ENOENT},
		{name: "error in a multipart done", replies: [][]byte{
			func() []byte {
				b := ackReply(unix.NLMSG_DONE, first+1, -int32(unix.EBUSY))
				binary.NativeEndian.PutUint16(b[6:], unix.NLM_F_MULTI)
				return b
			}(),
		}, is: unix.EBUSY},
		{name: "too long", replies: [][]byte{make([]byte, ackBufferBytes+1)}, want: "longer than"},
		{name: "bad length", replies: [][]byte{func() []byte {
			b := ackReply(unix.NLMSG_ERROR, first+1, 0)
			binary.NativeEndian.PutUint32(b, 400)
			return b
		}()}, want: "bad length"},
		{name: "short error", replies: [][]byte{appendNlmsghdr(nil, nlmsgHeaderLen, unix.NLMSG_ERROR, 0)}, want: "short error"},
		{name: "silence", replies: [][]byte{ackReply(unix.NLMSG_ERROR, first+1, 0)}, is: os.ErrDeadlineExceeded},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_DGRAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0)
			if err != nil {
				t.Fatal(err)
			}
			reader := os.NewFile(uintptr(fds[0]), "reader")
			defer reader.Close()
			defer unix.Close(fds[1])
			for _, r := range tc.replies {
				if _, err := unix.Write(fds[1], r); err != nil {
					t.Fatal(err)
				}
			}
			if err := reader.SetReadDeadline(time.Now().Add(200 * time.Millisecond)); err != nil {
				t.Fatal(err)
			}
			rc, err := reader.SyscallConn()
			if err != nil {
				t.Fatal(err)
			}
			var w Conn
			err = w.readAcks(rc, first, msgs)
			switch {
			case tc.want == "" && tc.is == nil:
				if err != nil {
					t.Fatalf("readAcks: %v", err)
				}
			case err == nil:
				t.Fatal("readAcks: no error")
			case tc.want != "" && !strings.Contains(err.Error(), tc.want):
				t.Errorf("error %q, want one containing %q", err, tc.want)
			case tc.is != nil && !errors.Is(err, tc.is):
				t.Errorf("error %q is not %v", err, tc.is)
			}
		})
	}
}
