#pragma once
// The registry dashboard's page, script and style (resolver/dashboard/), compiled into the
// library by cmake/TroupeEmbed.cmake.

#include <kj/array.h>
#include <kj/string.h>

namespace troupe::resolver_detail {

struct DashboardAsset {
  kj::StringPtr path;         // "/index.html", "/dashboard.js", "/dashboard.css"
  kj::StringPtr contentType;  // "text/html; charset=utf-8", ...
  kj::StringPtr body;
};

// Every asset; constant data, valid for the life of the process.
kj::ArrayPtr<const DashboardAsset> dashboardAssets();

}  // namespace troupe::resolver_detail
