//! etcd's Authenticate, for clients that log in with a user and password
//! (clientv3's `Username`/`Password`, etcd-client's `with_user`): the
//! password is a bearer token watchproxy accepts (from its token file, or
//! a JWT) that names the user, and the token etcd's client then sends with
//! every call is that same token.

use tonic::metadata::{MetadataMap, MetadataValue};
use tonic::{Request, Response, Status};

use super::wire::header;
use super::EtcdApi;
use crate::api::error::{etcd_status, ApiError};
use crate::etcdpb::etcdserverpb::{AuthenticateRequest, AuthenticateResponse};

impl EtcdApi {
    pub async fn etcd_authenticate(
        &self,
        request: Request<AuthenticateRequest>,
    ) -> Result<Response<AuthenticateResponse>, Status> {
        let login = request.into_inner();
        let mut metadata = MetadataMap::new();
        let bearer = MetadataValue::try_from(format!("Bearer {}", login.password))
            .map_err(|_| etcd_status(ApiError::LoginFailed))?;
        metadata.insert("authorization", bearer);
        // The password alone says who calls, whatever the connection's
        // certificate says; a refusal is counted and logged as any other.
        let identity = (self.core.authority().current().auth)
            .identify(&metadata, None)
            .map_err(|_| etcd_status(ApiError::LoginFailed))?;
        if identity.caller.user != login.name {
            return Err(etcd_status(ApiError::LoginFailed));
        }
        (self.core.user_limits().unary(&identity)).map_err(ApiError::from)?;
        Ok(Response::new(AuthenticateResponse {
            header: header(0),
            token: login.password,
        }))
    }
}
