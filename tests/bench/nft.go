package bench

import "github.com/go-logr/logr/funcr"

// quiet discards logs (logr.Discard has a nil sink, which the product
// replaces with klog).
var quiet = funcr.New(func(prefix, args string) {}, funcr.Options{})
