// Ends the connections a stopping server still holds. cpp-httplib keeps a kept-alive connection
// on its thread until --idle-timeout passes and gives no handle on its socket, so a SIGTERM would
// wait that long for clients that have nothing more to ask. Shutting the reading side of each
// accepted socket ends those at once; a request being handled still writes its response.
#pragma once

namespace kvtier {

// Shuts the reading side of every connected TCP socket of this process whose local port is
// `port` (the ones the listener on that port accepted). Returns how many.
int shut_accepted_connections(int port);

}  // namespace kvtier
