package nftnl

import (
	"strings"

	"github.com/nftpolicy/nftpolicy/pkg/compile"
)

// keyOf is the typed key of a declaration's type text ("ipv4_addr .
// inet_service", a map's "… : verdict"), for tests that write sets as
// nft declares them; nil for a field the compiler does not declare.
func keyOf(typ string) []compile.KeyKind {
	kinds := map[string]compile.KeyKind{"ipv4_addr": compile.KeyIPv4, "ipv6_addr": compile.KeyIPv6, "inet_proto": compile.KeyProto, "inet_service": compile.KeyService}
	key, _, _ := strings.Cut(typ, " : ")
	var out []compile.KeyKind
	for _, f := range strings.Split(key, " . ") {
		k, ok := kinds[strings.TrimSpace(f)]
		if !ok {
			return nil
		}
		out = append(out, k)
	}
	return out
}
