// Command etcd is etcd's own server entry point, built from the same module
// graph as Kubernetes so that the server matches the client the API server uses.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() {
	etcdmain.Main(os.Args)
}
